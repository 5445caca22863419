"""``MultiTurnStarPOTrainer``: TRL's ``GRPOTrainer`` with whole episodes in text envs.

It overrides one hook of the GRPO step, ``_generate_and_score_completions``: the episode engine
plays ``num_start_states x num_generations`` episodes, env rewards (plus format penalties) score
them, the StarPO-S variance filter keeps the groups with the largest in-group reward std, and
only then are the expensive old-policy / reference forward passes run on what is kept. TRL's
clipped loss then trains on model tokens only: env tokens travel as TRL's ``tool_mask``.
Held-out evaluation (``evaluate``) plays fixed seeds at ``eval_temperature``.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import Trainer, TrainerCallback
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import use_adapter

from envs.contract import env_name
from starpo_trl.algorithms import (
    get_estimator,
    group_std,
    turn_end_mask,
    whiten,
)
from starpo_trl.algorithms.critic import build_critic
from starpo_trl.algorithms.scoring import add_function_rewards, critic_turn_rewards, score_rollout
from starpo_trl.algorithms.value_model import explained_variance
from starpo_trl.config import ROLLOUT_SETTINGS_FILE, StarPOConfig, rollout_config
from starpo_trl.env_configs import EnvConfig
from starpo_trl.monitoring.guard import CollapseGuard, rules_from_config
from starpo_trl.monitoring.metrics import (
    critic_metrics,
    episode_metrics,
    rollout_metrics,
    sample_rows,
)
from starpo_trl.monitoring.model_card import render_model_card
from starpo_trl.monitoring.mutual_info import MI_KEYS, EMANormalizer, mi_from_sample, mi_sample
from starpo_trl.rollout import Episode, HFBackend, Rollout, RolloutEngine, StartState
from starpo_trl.rollout.batch import episode_filter_values, episode_rows, episodes_to_tensors, padded_rows
from starpo_trl.rollout.lora_sync import AdapterSync, lora_engine, lora_rank
from starpo_trl.rollout.vllm_backend import VLLMBackend, vllm_importance_sampling_ratio


def env_reward(completions, episode_reward, **kwargs) -> list[float]:
    """TRL reward function for episodes: the env's total reward (plus format penalties) of each one.

    GRPOTrainer requires a reward source; for episodes it is the env, and the trainer fills
    ``episode_reward`` itself, so this function only reads it back.
    """
    return [float(r) for r in episode_reward]


def start_state_dataset(args: StarPOConfig) -> Dataset:
    """One row per training start state (its seed); TRL's sampler repeats each row into a group."""
    return Dataset.from_dict(
        {"seed": list(range(args.train_seed_offset, args.train_seed_offset + args.num_train_seeds))}
    )


RUN_STATE_FILE = "starpo_state.json"  # in each checkpoint: the trainer's own state between steps


class _SkipEmptyUpdate(TrainerCallback):
    """Drops the gradients before the optimizer step of a skipped (empty) step, so AdamW leaves every
    weight and its moments as they were (it skips parameters without a gradient). Under DeepSpeed the
    engine steps inside ``backward``: there the step runs with a zero gradient."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.trainer.skip_update:
            for p in self.trainer.model.parameters():
                p.grad = None


class MultiTurnStarPOTrainer(GRPOTrainer):
    """Multi-turn StarPO / StarPO-S on TRL's GRPO machinery.

    Args:
        model: a model id or a loaded causal LM (as for `GRPOTrainer`).
        args: a `StarPOConfig` with `env_id` set.
        processing_class: the tokenizer (loaded from the model when omitted).
        train_dataset: optional; by default one row per training seed.
        backend: optional generation backend (`starpo_trl.rollout.GenerationBackend`); default
            `HFBackend` on the policy itself.
        reasoning_reward_fn: optional `(think, answer, previous_think, turn) -> float`, added to
            each turn's reward (see `starpo_trl.rollout.shaping`).
        reward_funcs: optional TRL-style reward functions, `f(prompts, completions, **kwargs) -> list[float]`,
            called on every training rollout with each episode's first message (`prompts`), the rest of
            its conversation (`completions`, message dicts) and `env_id`, `seed`, `success`, `env_reward`
            per episode; their sum (None counts 0) is added to the episode's last turn, on top of the env's
            rewards (`get_reward()` of a TRL environment class included). Logged as `rewards/<name>/mean`.
        value_model: optional model (or Hub id / local dir) whose decoder initialises a full critic,
            e.g. the policy's weights before a warm start; it must share the policy's tokenizer.
            Default: the policy's own weights.
        recipe: optional recipe text (the YAML the run was started from), shown in the model card.
    """

    def __init__(
        self,
        model,
        args: StarPOConfig,
        processing_class=None,
        train_dataset=None,
        callbacks=None,
        peft_config=None,
        backend=None,
        reasoning_reward_fn=None,
        reward_funcs=None,
        value_model=None,
        recipe: str | None = None,
    ):
        if not isinstance(args, StarPOConfig) or args.env_id is None:
            raise ValueError(
                "MultiTurnStarPOTrainer needs a StarPOConfig with env_id set, e.g. env_id='starpo/Sokoban-v0'."
            )
        # adapter-only vLLM sync: TRL's engine is built with LoRA support during construction
        engine = lora_engine(lora_rank(model, peft_config)) if args.vllm_lora_sync else nullcontext()
        with engine:
            super().__init__(
                model=model,
                reward_funcs=[env_reward],
                args=args,
                train_dataset=train_dataset if train_dataset is not None else start_state_dataset(args),
                processing_class=processing_class,
                callbacks=callbacks,
                peft_config=peft_config,
            )
        self.adapter_sync = self._build_adapter_sync() if args.vllm_lora_sync else None
        self.rollout_config = rollout_config(args)
        self._backend = backend
        self.extra_reward_funcs = list(reward_funcs or [])
        self.kept_group_history: list[dict] = []  # per rollout: groups the filter kept, and every group's std
        self.evaluation_results: dict[str, dict] = {}  # name -> held-out metrics, shown in the model card
        self.recipe = recipe  # the recipe text, shown in the model card
        self.group_envs = args.group_envs()  # the env of each group of a step
        envs = args.train_envs()
        self.group_env_index = [envs.index(env) for env in self.group_envs]
        self._named_envs = envs + args.eval_envs()
        self.critic = build_critic(self.accelerator.unwrap_model(self.model), args, self.accelerator, value_model)
        # Built once: it checks the chat template (prefix preservation) before any training step.
        self.engine = RolloutEngine(
            self._tokenizer, None, self.rollout_config, self.eos_token_ids, reasoning_reward_fn=reasoning_reward_fn
        )
        self._vllm_backend = None
        self.skip_update, self.empty_steps_in_a_row, self.filtered_out_in_a_row = False, 0, 0
        self.add_callback(_SkipEmptyUpdate(self))
        self.guard = self._build_guard() if args.collapse_guard != "off" else None
        self._mi_normalizer = EMANormalizer()

    def _build_adapter_sync(self):
        """Adapter-only LoRA sync to a colocated vLLM engine (refused where the adapter is sharded)."""
        if self.is_fsdp_enabled or (
            self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3
        ):
            raise ValueError(
                "vllm_lora_sync saves the adapter from each process, which ZeRO-3 / FSDP shard: use ZeRO-2 or DDP, or vllm_lora_sync=False."
            )
        return AdapterSync(self.vllm_generation, self.accelerator.unwrap_model(self.model))

    def _build_guard(self):
        """The collapse guard callback (stop / rollback refused under ZeRO-3: they copy the weights)."""
        args = self.args
        if (
            args.collapse_guard in ("stop", "rollback")
            and self.is_deepspeed_enabled
            and self.accelerator.state.deepspeed_plugin.zero_stage == 3
        ):
            raise ValueError(
                "collapse_guard='stop'/'rollback' keeps a copy of the weights, which ZeRO-3 shards: use collapse_guard='warn' or ZeRO-2."
            )
        guard = CollapseGuard(
            args.collapse_guard,
            rules_from_config(args),
            args.collapse_guard_snapshot_steps,
            save_model=self.save_model,
            critic=self.critic,
        )
        self.add_callback(guard)
        return guard

    # -- rollouts ------------------------------------------------------------------------------------
    def play(self, starts: list[StartState], temperature: float) -> Rollout:
        """Play episodes from ``starts`` with the current policy."""
        progress = not self.args.disable_tqdm and self.accelerator.is_main_process
        if self._backend is not None:
            return self.engine.run(starts, temperature, self._backend, progress)
        if self.use_vllm:
            if self.state.global_step != self._last_loaded_step:  # push the current weights (or LoRA adapter) to vLLM
                if self.adapter_sync is not None:
                    self.adapter_sync.push(self.state.global_step)
                else:
                    self.vllm_generation.sync_weights()
                self._last_loaded_step = self.state.global_step
            if self._vllm_backend is None:
                self._vllm_backend = VLLMBackend(
                    self.vllm_generation, self.eos_token_ids, self.accelerator, self._tokenizer.pad_token_id
                )
            return self.engine.run(starts, temperature, self._vllm_backend, progress)
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator) as unwrapped:
            return self.engine.run(
                starts, temperature, HFBackend(unwrapped, self._tokenizer.pad_token_id, self.eos_token_ids), progress
            )

    def _starts(self, seeds, env: EnvConfig) -> list[StartState]:
        return [StartState(env.env_id, int(seed), env.key[1]) for seed in seeds]

    def _env_name(self, episode: Episode) -> str:
        """The name an episode's metrics are logged under (its env config's ``name``)."""
        start = episode.start
        for env in self._named_envs:
            if env.env_id == start.env_id and env.key[1] == start.env_kwargs:
                return env.name
        return env_name(start.env_id)

    def _train_starts(self, seeds) -> list[StartState]:
        """This process's start states: its groups' seeds, each in its group's env (``env_configs``)."""
        group = self.num_generations
        first = self.accelerator.process_index * (len(seeds) // group)  # groups are dealt to processes in order
        envs = [self.group_envs[first + i // group] for i in range(len(seeds))]
        return [StartState(env.env_id, int(seed), env.key[1]) for seed, env in zip(seeds, envs)]

    # -- the one overridden GRPO hook -----------------------------------------------------------------
    def _max_over_processes(self, n: int) -> int:
        """The largest ``n`` over the processes (each must train on the same number of rows)."""
        if self.accelerator.num_processes == 1:
            return n
        return int(self.accelerator.gather(torch.tensor([n], device=self.accelerator.device)).max())

    def _gather_episodes(self, local: list[Episode]) -> list[Episode]:
        """Every process's episodes, in process order (the order of TRL's sampler, so groups stay contiguous)."""
        if self.accelerator.num_processes == 1:
            return local
        return gather_object(local)

    def _generate_and_score_completions(self, inputs):
        """The StarPO step, in the order data flows: play -> filter -> advantages -> (critic) -> batch.

        Kept in one function (about 95 lines: longer than the project's 60 since several envs, padded
        rows and the MI pass joined it; splitting it is open work) so the whole step reads top to
        bottom; each stage is a call into ``rollout``, ``algorithms`` or a method below."""
        args: StarPOConfig = self.args
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        group = self.num_generations
        starts = self._train_starts([x["seed"] for x in inputs])
        # Each process plays its share; filtering, normalisation and group advantages then run on the
        # gathered batch (identical on every process), and the kept trajectories are dealt out evenly.
        rollout = self.play(starts, self.temperature)
        # TRL-style reward functions, on this process's episodes (each function runs once per episode)
        for name, mean in add_function_rewards(rollout, self.extra_reward_funcs).items():
            self._metrics[mode][f"rewards/{name}/mean"].append(mean)
        episodes = self._gather_episodes(rollout)
        if mode == "train" and args.mi_metrics_every and self.state.global_step % args.mi_metrics_every == 0:
            self._log_mutual_information(rollout)

        failed = torch.tensor([ep.env_error is not None for ep in episodes])
        scored = score_rollout(
            [ep.reward for ep in episodes],
            failed,
            group,
            args,
            self.scale_rewards,
            *episode_filter_values(episodes, args.rollout_filter_metric),
            num_processes=self.accelerator.num_processes,
            group_env=self.group_env_index,
        )
        rewards, kept_groups, keep, kept_rewards = scored.rewards, scored.kept_groups, scored.keep, scored.kept_rewards
        # this process's rows of the kept batch
        share = len(keep) // self.accelerator.num_processes
        mine = slice(self.accelerator.process_index * share, (self.accelerator.process_index + 1) * share)
        if mode == "train":  # the same on every process; rank summaries compare it
            stds = torch.nan_to_num(group_std(rewards, group), nan=-1.0)
            self.kept_group_history.append(
                {"kept": kept_groups.tolist(), "group_std": [round(x, 6) for x in stds.tolist()]}
            )
        local_keep = keep[mine]
        kept = [episodes[i] for i in local_keep.tolist()]
        # the training rows: one per kept episode, or with a context window one per turn (owner: its episode)
        rows, owner = episode_rows(kept)
        # a row count that varies (by step or by process): padded with rows that hold no model token
        padding = padded_rows(self._max_over_processes(len(rows)), args.steps_per_generation) - len(rows)
        real_rows = len(rows)
        rows = rows + [rows[0] if rows else episodes[0]] * padding

        batch = episodes_to_tensors(rows, self._tokenizer.pad_token_id, device)
        if args.env_error_policy == "exclude":
            batch["tool_mask"][:real_rows][failed[local_keep][owner].to(device)] = 0
        batch["tool_mask"][real_rows:] = 0
        loss_mask = batch["completion_mask"] * batch["tool_mask"]
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        empty = mode == "train" and int(batch["num_items_in_batch"]) == 0
        if mode == "train":
            self._check_empty_step(empty, filtered_out=len(kept_groups) == 0)

        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logits_to_keep = batch["completion_ids"].size(1)
        if scored.advantages is not None:  # a trajectory's advantage on each of its rows
            advantages = torch.cat([scored.advantages[mine][owner], torch.zeros(padding)]).to(device)
        else:
            advantages = self._critic_advantages(
                rows,
                rewards[keep],
                kept_rewards,
                mine,
                batch,
                input_ids,
                attention_mask,
                logits_to_keep,
                loss_mask,
                mode,
            )
            if mode == "train" and not empty:
                real = slice(0, len(kept))  # the same number on every process: the padding is not trained on
                self._train_critic(
                    input_ids[real],
                    attention_mask[real],
                    logits_to_keep,
                    batch["old_values"][real],
                    batch["returns"][real],
                    batch["value_mask"][real],
                )
        batch["advantages"] = advantages
        self._old_and_ref_logps(batch, input_ids, attention_mask, logits_to_keep, loss_mask)
        row_advantages = (
            advantages if advantages.dim() == 1 else (advantages * loss_mask).sum(1) / loss_mask.sum(1).clamp(min=1)
        )
        episode_advantages = row_advantages[:real_rows] if len(owner) == len(kept) else scored.advantages[mine]
        trained_tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows[:real_rows])
        self._log_rollout(
            mode, episodes, trained_tokens, rewards, episode_advantages, len(kept_groups), keep, rollout.timings
        )
        return batch

    def _log_mutual_information(self, local: list[Episode]) -> None:
        """The MI collapse metrics (``starpo_trl.monitoring.mutual_info``) on this process's episodes, averaged
        over processes; every process makes the same number of forward passes (sharded weights gather)."""
        args: StarPOConfig = self.args
        generator = torch.Generator().manual_seed(args.seed * 7919 + self.state.global_step)
        sample = mi_sample(
            local,
            self._tokenizer,
            self.num_generations,
            args.mi_metrics_inputs,
            args.mi_metrics_per_input,
            args.mi_metrics_turn,
            generator,
        )
        batch = args.per_device_train_batch_size
        batches = torch.tensor(-(-len(sample[0]) * len(sample[1]) // batch), device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            batches = self.accelerator.gather(batches).max()
        was_training = self.model.training
        self.model.eval()
        started = time.perf_counter()
        stats = mi_from_sample(self.model, sample, self._tokenizer.pad_token_id, batch, self.temperature, int(batches))
        if was_training:
            self.model.train()
        self._metrics["train"]["collapse/mi_seconds"].append(time.perf_counter() - started)
        values = torch.tensor([stats.get(k, math.nan) for k in MI_KEYS], dtype=torch.float64, device=batches.device)
        if self.accelerator.num_processes > 1:
            values = self.accelerator.gather(values[None]).nanmean(dim=0)
        for key, value in zip(MI_KEYS, values.tolist()):
            if math.isfinite(value):
                self._metrics["train"][f"collapse/{key}"].append(value)
        if math.isfinite(values[0]):  # the MI estimate against its own running level
            z = self._mi_normalizer(float(values[0]))
            if math.isfinite(z):
                self._metrics["train"]["collapse/mi_zscore_ema"].append(z)

    @torch.no_grad()
    def _old_and_ref_logps(self, batch, input_ids, attention_mask, logits_to_keep, loss_mask) -> None:
        """The forward passes TRL's loss may need, on the kept rows only: old-policy logprobs (when
        the batch is reused over several optimizer steps, or to correct vLLM's sampler) and the
        reference model's (``beta != 0``)."""
        args: StarPOConfig = self.args
        generate_every = args.steps_per_generation * self.num_iterations
        vllm_correction = self.use_vllm and self.vllm_importance_sampling_correction
        if args.gradient_accumulation_steps % generate_every != 0 or vllm_correction:
            batch["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, logits_to_keep, batch_size=args.per_device_train_batch_size
            )
        if vllm_correction:  # vLLM's sampler and the trainer's forward differ: TRL's IS weight corrects it
            batch["importance_sampling_ratio"] = vllm_importance_sampling_ratio(
                batch["old_per_token_logps"],
                batch["sampling_per_token_logps"],
                loss_mask,
                self.vllm_importance_sampling_mode,
                self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max,
            )
        if self.beta != 0.0:
            if self.ref_model is not None:
                ref_model, ctx = self.ref_model, nullcontext()
            else:  # PEFT: the base with the adapter off, or the initial copy "ref" when re-training an adapter (as TRL)
                ref_model = self.model
                unwrapped = self.accelerator.unwrap_model(self.model)
                ctx = use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None)
            with ctx:
                batch["ref_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    ref_model, input_ids, attention_mask, logits_to_keep, batch_size=args.per_device_train_batch_size
                )

    def _critic_advantages(
        self, kept, raw, normalized, mine, batch, input_ids, attention_mask, logits_to_keep, loss_mask, mode
    ):
        """Per-token advantages (B, T) of this process's rows ``kept`` (kept episodes, then padding) from the critic's values;
        stores ``old_values`` and ``returns``. ``raw``/``normalized`` are the whole kept batch's rewards
        (group statistics need all of it); ``mine`` slices out this process's rows."""
        args: StarPOConfig = self.args
        values = (
            self.critic.values(input_ids, attention_mask, logits_to_keep, args.per_device_train_batch_size) * loss_mask
        )
        ends = [ep.turn_end_positions for ep in kept]
        real = mine.stop - mine.start  # rows after these are padding (no model token): zero rewards
        turn_rewards = critic_turn_rewards(
            [ep.turn_rewards for ep in kept[:real]], raw, normalized, mine, self.num_generations, args
        ) + [[0.0] * len(ep.turn_rewards) for ep in kept[real:]]
        advantages, returns = get_estimator(args.advantage_estimator).fn(turn_rewards, ends, values, loss_mask, args)
        # where the critic learns: every model token, or (VAGEN's choice) each turn's last model token
        value_mask = loss_mask if args.value_loss_tokens == "all" else turn_end_mask(ends, loss_mask)
        batch["old_values"], batch["returns"], batch["value_mask"] = values, returns, value_mask
        self._metrics[mode]["critic/explained_variance"].append(explained_variance(values, returns, value_mask))
        if args.whiten_advantages:  # over the model tokens of the whole kept batch, as on one process
            m = loss_mask.bool()
            x = advantages[m].double()
            stats = torch.stack([m.sum().double(), x.sum(), (x * x).sum()])
            stats = self.accelerator.reduce(stats, reduction="sum") if self.accelerator.num_processes > 1 else stats
            advantages = whiten(advantages, loss_mask, tuple(stats.tolist()))
        for key, value in critic_metrics(advantages, returns, values, loss_mask).items():
            self._metrics[mode][key].append(value)
        return advantages

    def _train_critic(self, input_ids, attention_mask, logits_to_keep, old_values, returns, mask):
        """Once per rollout batch, before the policy's update (the advantages already hold the values from
        before it): ``critic_epochs`` passes over this process's rows in ``steps_per_generation`` micro-batches,
        in an order that is the same on every process and new every step."""
        args: StarPOConfig = self.args
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + self.state.global_step)
        for stats in self.critic.fit(
            input_ids,
            attention_mask,
            logits_to_keep,
            old_values,
            returns,
            mask,
            args.critic_epochs,
            args.steps_per_generation,
            generator,
            args.max_grad_norm,
            reduce=self._reduce_grads,
        ):
            for key, value in stats.items():  # averaged by the logger
                self._metrics["train"][f"critic/{key}"].append(value)

    def _check_empty_step(self, empty: bool, filtered_out: bool = False) -> None:
        """A step with no model token to train on (every kept episode failed, or the filter kept no
        group) is skipped: the optimizer does not step (``_SkipEmptyUpdate``). ``max_empty_steps`` such
        steps in a row (``rollout_filter_empty_stop_steps`` where the filter kept nothing) stop training
        with an error that names the cause."""
        args: StarPOConfig = self.args
        self.skip_update = empty
        self._metrics["train"]["rollout/empty_step"].append(float(empty))
        self._metrics["train"]["rollout/empty_after_filter"].append(float(filtered_out))
        self.empty_steps_in_a_row = self.empty_steps_in_a_row + 1 if empty and not filtered_out else 0
        self.filtered_out_in_a_row = self.filtered_out_in_a_row + 1 if filtered_out else 0
        if self.filtered_out_in_a_row >= args.rollout_filter_empty_stop_steps:
            raise RuntimeError(
                f"The rollout filter kept no group {self.filtered_out_in_a_row} steps in a row "
                f"(rollout_filter_strategy={args.rollout_filter_strategy!r}, metric={args.rollout_filter_metric!r}, "
                f"include_zero={args.rollout_filter_include_zero}): every group's score was zero or below the "
                "threshold, so the policy gets no signal (collapsed, or the task is too hard or too easy). Set "
                "rollout_filter_include_zero=True, lower rollout_filter_eps, use top_k, or raise "
                "rollout_filter_empty_stop_steps."
            )
        if self.empty_steps_in_a_row >= args.max_empty_steps:
            raise RuntimeError(
                f"{self.empty_steps_in_a_row} steps in a row had no model token to train on: every kept episode failed "
                f"before the model wrote anything (see env/errors and the episodes' env_error). Fix the env "
                f"({args.env_id}) or raise max_empty_steps."
            )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.critic is not None and self.model.training and self.state.global_step < self.args.critic_warmup_steps:
            # critic warm-up: the policy gets a zero loss (no gradient) until the critic has learned
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss * 0.0
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _reduce_grads(self, params):
        """Average the critic's gradients over processes (it is not wrapped in DDP)."""
        if self.accelerator.num_processes > 1:
            for p in params:
                if p.grad is not None:
                    p.grad = self.accelerator.reduce(p.grad, reduction="mean")

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.critic is not None:  # on every process: gathering a sharded critic optimizer is collective
            self.critic.save(os.path.join(folder, "value_model"), write=self.args.should_save)
        if self.args.should_save:  # what the next step's metrics compare against (the last step's reasoning)
            with open(os.path.join(folder, RUN_STATE_FILE), "w") as f:
                json.dump(
                    {
                        "previous_thinks": getattr(self, "_previous_thinks", None),
                        "empty_steps_in_a_row": self.empty_steps_in_a_row,
                        "filtered_out_in_a_row": self.filtered_out_in_a_row,
                    },
                    f,
                )

    def _load_optimizer_and_scheduler(self, checkpoint):
        # Trainer calls this on every resume (DDP, DeepSpeed and FSDP alike), after the policy's weights
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.load_critic(checkpoint)
            path = os.path.join(checkpoint, RUN_STATE_FILE)
            if os.path.isfile(path):
                with open(path) as f:
                    state = json.load(f)
                if state.get("previous_thinks") is not None:
                    self._previous_thinks = state["previous_thinks"]
                self.empty_steps_in_a_row = int(state.get("empty_steps_in_a_row", 0))
                self.filtered_out_in_a_row = int(state.get("filtered_out_in_a_row", 0))

    def load_critic(self, checkpoint: str) -> None:
        """Restore the critic (weights and optimizer) saved in ``checkpoint/value_model``, if any."""
        path = os.path.join(checkpoint, "value_model")
        if self.critic is not None and os.path.isdir(path):
            self.critic.load(path)

    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:  # how to play this model's episodes: evaluate.py reads it back
            folder = output_dir or self.args.output_dir
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, ROLLOUT_SETTINGS_FILE), "w") as f:
                json.dump(self.args.rollout_settings(), f, indent=2)
        if self.critic is not None and not _internal_call:  # every process calls save_model, as Trainer expects
            self.critic.save(
                os.path.join(output_dir or self.args.output_dir, "value_model"), write=self.args.should_save
            )

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, **kwargs):
        """Write ``README.md`` (model card) to ``output_dir``: env, StarPO settings, evaluation table, recipe."""
        if not self.is_world_process_zero():
            return
        unwrapped = self.accelerator.unwrap_model(self.model)
        config = unwrapped.config
        base = getattr(config, "_name_or_path", None) or None
        if base is not None and (os.path.isdir(base) or base == "tiny"):
            base = None  # only Hub ids are linked
        card = render_model_card(
            self.args,
            base,
            self.evaluation_results,
            self.recipe,
            model_name or self.hub_model_id,
            adapter=hasattr(unwrapped, "peft_config"),
        )
        os.makedirs(self.args.output_dir, exist_ok=True)
        card.save(os.path.join(self.args.output_dir, "README.md"))

    def _log_rollout(self, mode, episodes, trained_tokens, rewards, advantages, num_kept_groups, keep, timings):
        """Metrics over the whole gathered batch ``episodes`` (the same on every process); ``advantages``
        are this process's kept episodes', gathered for the sample table; ``trained_tokens`` the tokens
        of this process's training rows (prompt + completion; with a context window, each turn's)."""
        group = self.num_generations
        shaping = self.rollout_config.think_shaping.enabled or self.engine.reasoning_reward_fn is not None
        metrics, thinks = rollout_metrics(
            episodes,
            rewards,
            group,
            num_kept_groups,
            self._env_name,
            timings,
            self.args.enable_think,
            getattr(self, "_previous_thinks", None),
            shaping,
        )
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)
        if self.args.enable_think:
            self._previous_thinks = thinks
        if mode == "train":
            tokens = int(
                self.accelerator.gather(torch.tensor(float(trained_tokens), device=self.accelerator.device)).sum()
            )
            self.state.num_input_tokens_seen += tokens
            self._metrics[mode]["rollout/tokens_trained"].append(float(tokens))  # this step's rows, every process
        # sample episodes for TRL's completions table (log_completions=True): whole conversations
        all_advantages = (
            advantages.tolist() if self.accelerator.num_processes == 1 else gather_object(advantages.tolist())
        )
        for row in sample_rows([episodes[i] for i in keep.tolist()], all_advantages, self.args.num_sample_episodes):
            for key in ("prompt", "completion", "advantages"):
                self._logs[key].append(row[key])
            self._logs["rewards"]["env"].append(row["reward"])
            for key in ("seed", "success", "turns"):
                self._logs["extra"][key].append(row[key])

    # -- held-out evaluation ----------------------------------------------------------------------------
    def evaluate_success(self, num_episodes: int | None = None, name: str | None = None) -> dict[str, float]:
        """Play the fixed held-out seeds at ``eval_temperature``; return episode metrics. With ``name``
        (e.g. ``"before RL"``) they are also kept for the model card's evaluation table."""
        args: StarPOConfig = self.args
        n = num_episodes or args.num_eval_episodes
        seeds = range(args.eval_seed_offset, args.eval_seed_offset + n)
        was_training = self.model.training
        self.model.eval()
        # each process plays every num_processes-th seed; the metrics are over all of them
        mine = list(seeds)[self.accelerator.process_index :: self.accelerator.num_processes]
        # in calls of eval_rollout_batch_size episodes (memory grows with episodes x history); every
        # process makes the same number of calls, as a collective backend needs
        per_call = args.eval_rollout_batch_size
        metrics, all_episodes = {}, []
        envs = args.eval_envs()
        for env in envs:
            local = []
            for k in range(math.ceil(math.ceil(n / self.accelerator.num_processes) / per_call)):
                local += self.play(self._starts(mine[k * per_call : (k + 1) * per_call], env), args.eval_temperature)
            episodes = self._gather_episodes(local)
            all_episodes += episodes
            if len(envs) > 1:  # one row block per eval env; the unprefixed metrics are over all of them
                metrics.update({f"{env.name}/{k}": v for k, v in episode_metrics(episodes).items()})
        if was_training:
            self.model.train()
        self.last_eval_episodes = all_episodes
        metrics = {**episode_metrics(all_episodes), **metrics}
        if name is not None:
            self.evaluation_results[name] = metrics
        return metrics

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        metrics = {f"{metric_key_prefix}_{k}": v for k, v in self.evaluate_success().items()}
        Trainer.log(self, metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics
