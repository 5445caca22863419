"""``MultiTurnStarPOTrainer``: TRL's ``GRPOTrainer`` with whole episodes in text envs.

It overrides one hook of the GRPO step, ``_generate_and_score_completions``: the episode engine
plays ``num_start_states x num_generations`` episodes, env rewards (plus format penalties) score
them, the StarPO-S variance filter keeps the groups with the largest in-group reward std, and
only then are the expensive old-policy / reference forward passes run on what is kept. TRL's
clipped loss then trains on model tokens only: env tokens travel as TRL's ``tool_mask``.
Held-out evaluation (``evaluate``) plays fixed seeds at ``eval_temperature``.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from accelerate.utils import gather_object
from transformers import Trainer
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import use_adapter

from starpo_trl.algorithms.critic import build_critic
from starpo_trl.algorithms.critic_targets import TargetSettings, critic_targets, fit_critic
from starpo_trl.algorithms.estimators import turn_advantages
from starpo_trl.algorithms.scoring import Scored, add_function_rewards, critic_turn_rewards, env_reward, score_rollout
from starpo_trl.algorithms.settings import ScoringSettings
from starpo_trl.checkpoints import load_checkpoint_extras, load_critic, save_checkpoint_extras, save_model_extras
from starpo_trl.config import StarPOConfig, rollout_config
from starpo_trl.env_configs import held_out_calls, metrics_name, process_starts, start_state_dataset
from starpo_trl.monitoring.empty_steps import EmptySteps
from starpo_trl.monitoring.guard import build_guard
from starpo_trl.monitoring.metrics import episode_means, held_out_metrics, sample_rows
from starpo_trl.monitoring.model_card import write_model_card
from starpo_trl.monitoring.settings import GuardSettings, MISettings
from starpo_trl.monitoring.step_log import StepLog
from starpo_trl.refill import Refiller
from starpo_trl.rollout import Episode, HFBackend, Rollout, RolloutEngine, StartState
from starpo_trl.rollout.batch import (
    episode_filter_values,
    episode_rows,
    episodes_to_tensors,
    padded_rows,
    trim_completion_padding,
)
from starpo_trl.rollout.lora_sync import AdapterSync, lora_engine, lora_rank
from starpo_trl.rollout.vllm_backend import VLLMBackend, sync_weights, vllm_importance_sampling_ratio


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
                train_dataset=train_dataset if train_dataset is not None else start_state_dataset(args.train_seeds()),
                processing_class=processing_class,
                callbacks=callbacks,
                peft_config=peft_config,
            )
        zero3 = self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3
        unwrapped = self.accelerator.unwrap_model(self.model)
        sharded = zero3 or self.is_fsdp_enabled
        self.adapter_sync = (
            AdapterSync(self.vllm_generation, unwrapped, sharded=sharded) if args.vllm_lora_sync else None
        )
        self.rollout_config, self.scoring = rollout_config(args), ScoringSettings.of(args)  # the wings' own settings
        self._backend = backend  # a given backend; else HF generation or TRL's vLLM engine
        self._vllm_backend = None
        self.extra_reward_funcs = list(reward_funcs or [])
        self.evaluation_results: dict[str, dict] = {}  # name -> held-out metrics, shown in the model card
        self.recipe = recipe  # the recipe text, shown in the model card
        self.group_envs = args.group_envs()  # the env of each group of a step
        self.group_env_index = [args.train_envs().index(env) for env in self.group_envs]
        self._build_critic(args, unwrapped, value_model)
        # Built once: it checks the chat template (prefix preservation) before any training step.
        self.engine = RolloutEngine(
            self._tokenizer, None, self.rollout_config, self.eos_token_ids, reasoning_reward_fn=reasoning_reward_fn
        )
        self._build_monitoring(
            args, zero3, shaping=self.rollout_config.shapes_think or reasoning_reward_fn is not None
        )
        refill = args.rollout_filter_refill  # more rounds when the filter keeps too few groups (starpo_trl.refill)
        play, gather, accel = self._play_and_reward, self._gather_episodes, self.accelerator
        self.refiller = (
            Refiller.of(args, self.group_envs, self.group_env_index, play, gather, accel) if refill else None
        )

    def _build_critic(self, args: StarPOConfig, policy, value_model) -> None:
        """The critic the estimator needs (None for one that needs none), held as the policy is, and the settings
        its targets are computed with, read once."""
        self.target_settings = settings = TargetSettings.of(args)
        self.critic = build_critic(
            policy,
            settings.critic,
            settings.advantages.advantage_estimator,
            self.accelerator,
            micro_batch=settings.micro_batch,
            max_grad_norm=settings.max_grad_norm,
            weight_decay=args.weight_decay,
            trust_remote_code=args.trust_remote_code,
            value_model=value_model,
        )

    def _build_monitoring(self, args: StarPOConfig, zero3: bool, shaping: bool) -> None:
        """The empty-step callback, the collapse guard and the step log, each with its own settings."""
        self.empty_steps = EmptySteps.of(args, lambda: self.model.parameters())
        envs = [env.name for env in args.train_envs()]
        self.guard = build_guard(GuardSettings.of(args), envs, zero3, self.save_model, self.critic)
        for callback in [self.empty_steps] + ([self.guard] if self.guard is not None else []):
            self.add_callback(callback)
        named = args.train_envs() + args.eval_envs()
        self.step_log = StepLog(
            self.rollout_config,
            MISettings.of(args),
            self.num_generations,
            lambda ep: metrics_name(named, ep.start),
            shaping,
            batch_size=args.per_device_train_batch_size,
            seed=args.seed,
        )
        self.kept_group_history = self.step_log.kept_groups  # per step: the groups kept, every group's std

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
                    sync_weights(self.vllm_generation)
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

    def _play_and_reward(self, starts: list[StartState], mode: str = "train") -> Rollout:
        """``play`` at the training temperature, then the TRL-style reward functions on these episodes."""
        rollout = self.play(starts, self.temperature)
        rewards = add_function_rewards(rollout, self.extra_reward_funcs, self.args.reward_func_errors)
        self._log(mode, {f"rewards/{name}/mean": mean for name, mean in rewards.items()})
        return rollout

    def _gather_episodes(self, local: list[Episode]) -> list[Episode]:
        """Every process's episodes, in process order (the order of TRL's sampler, so groups stay contiguous)."""
        return local if self.accelerator.num_processes == 1 else gather_object(local)

    def _sum_over_processes(self, x: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(x, reduction="sum") if self.accelerator.num_processes > 1 else x

    def _log(self, mode: str, metrics: dict[str, float]) -> None:
        """Metrics for TRL's logger, which averages each key's values over the logging interval."""
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)

    # -- the one overridden GRPO hook -----------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        """The StarPO step, in the order data flows: play -> filter -> advantages -> (critic) -> batch.

        Each process plays its share of the groups; filtering, normalisation and group advantages then
        run on the gathered batch (identical on every process), and the kept rows are dealt out evenly."""
        args: StarPOConfig = self.args
        mode = "train" if self.model.training else "eval"
        starts = process_starts(
            self.group_envs, [x["seed"] for x in inputs], self.num_generations, self.accelerator.process_index
        )
        rollout = self._play_and_reward(starts, mode)
        episodes = self._gather_episodes(rollout)
        if mode == "train" and args.mi_metrics_every and self.state.global_step % args.mi_metrics_every == 0:
            step, tok = self.state.global_step, self._tokenizer  # MI metrics on this process's episodes
            mi = self.step_log.mutual_information(self.model, rollout, tok, self.temperature, step, self.accelerator)
            self._log(mode, mi)
        kept_groups, group_env = None, self.group_env_index
        if mode == "train" and self.refiller is not None:  # more rounds while the filter keeps too few groups
            refilled, refill_metrics = self.refiller(episodes, self.state.global_step, rollout.timings)
            episodes, kept_groups, group_env = refilled.episodes, refilled.kept_groups, refilled.group_env
            self._log(mode, refill_metrics)
        failed = torch.tensor([ep.env_error is not None for ep in episodes])
        scored = score_rollout(
            [ep.reward for ep in episodes],
            failed,
            self.num_generations,
            self.scoring,
            self.scale_rewards,
            # the filter's per-episode values, unless the refill already chose the groups round by round
            *(episode_filter_values(episodes, args.rollout_filter_metric) if kept_groups is None else (None, None)),
            num_processes=self.accelerator.num_processes,
            group_env=group_env,
            kept_groups=kept_groups,
        )
        # this process's share of the kept batch: its kept episodes, their training rows, padding rows
        share = len(scored.keep) // self.accelerator.num_processes
        mine = slice(self.accelerator.process_index * share, (self.accelerator.process_index + 1) * share)
        kept = [episodes[i] for i in scored.keep[mine].tolist()]
        rows, owner = episode_rows(kept)  # one per kept episode, or with a context window one per turn
        rows, batch, loss_mask, forward = self._batch(rows, episodes[0], failed[scored.keep[mine]][owner])
        if mode == "train":
            self.step_log.record_kept_groups(scored)
            empty = int(batch["num_items_in_batch"]) == 0  # nothing to train on: no optimizer step
            zero = scored.advantages is not None and not bool(scored.advantages.ne(0).any())
            cut = empty and any(ep.masked_turns for ep in kept)  # overlong_turns: mask took every reply
            self._log(mode, self.empty_steps.update(empty, not len(scored.kept_groups), zero, cut_masked=cut))
        if scored.advantages is not None:  # a trajectory's advantage on each of its rows
            episode_advantages = scored.advantages[mine]
            padding = torch.zeros(len(rows) - len(owner))
            batch["advantages"] = torch.cat([episode_advantages[owner], padding]).to(loss_mask.device)
        else:
            batch["advantages"] = self._per_token(episodes, scored, mine, kept, rows, owner, batch, forward, mode)
            episode_advantages = episode_means(batch["advantages"], loss_mask, owner, len(kept))
        self._old_and_ref_logps(batch, *forward, loss_mask)
        trained_tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows[: len(owner)])
        self._log_rollout(mode, episodes, scored, episode_advantages, trained_tokens, rollout.timings)
        return batch

    def _batch(self, rows: list[Episode], spare: Episode, failed: torch.Tensor):
        """``rows`` (``failed``: which came from a failed episode) padded to the same number on every process
        (a multiple of ``steps_per_generation``) with rows that hold no model token, and as TRL's batch;
        also its loss mask and the policy's forward inputs ``(input_ids, attention_mask, logits_to_keep)``."""
        n, device = len(rows), self.accelerator.device
        if self.accelerator.num_processes > 1:  # the most rows any process holds
            n_max = int(self.accelerator.gather(torch.tensor([n], device=device)).max())
        else:
            n_max = n
        rows = rows + [rows[0] if rows else spare] * (padded_rows(n_max, self.args.steps_per_generation) - n)
        batch = episodes_to_tensors(rows, self._tokenizer.pad_token_id, device)
        if self.args.env_error_policy == "exclude":
            batch["tool_mask"][:n][failed.to(device)] = 0
        batch["tool_mask"][n:] = 0
        loss_mask = batch["completion_mask"] * batch["tool_mask"]
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        return rows, batch, loss_mask, (input_ids, attention_mask, batch["completion_ids"].size(1))

    def _per_token(self, episodes, scored: Scored, mine: slice, kept, rows, owner, batch, forward, mode: str):
        """Per-token advantages (B, T) of this process's ``rows`` (``kept`` episodes' rows, ``owner``: each one's
        episode, then padding): GiGPO's from the whole batch ``episodes`` without a critic, else the critic's
        (``algorithms.critic_targets``; targets into ``batch``), which then learns on them in a step not skipped,
        before the policy: on the kept episodes (as many on every process), or with a context window on every
        row, padding included (row counts differ between processes; padding has no value target)."""
        args: StarPOConfig = self.args
        loss_mask = batch["completion_mask"] * batch["tool_mask"]
        if self.critic is None:
            width, settings, group = loss_mask.size(1), self.scoring, self.num_generations
            return turn_advantages(episodes, scored, settings, group, mine, rows, owner, width).to(loss_mask.device)
        turns, raw, normalized = [ep.turn_rewards for ep in kept], scored.rewards[scored.keep], scored.kept_rewards
        turn_rewards = critic_turn_rewards(turns, raw, normalized, mine, self.num_generations, self.scoring)
        sum_all = self._sum_over_processes
        settings = self.target_settings
        targets = critic_targets(self.critic, rows, owner, turn_rewards, *forward, loss_mask, settings, sum_all)
        batch.update(old_values=targets.values, returns=targets.returns, value_mask=targets.value_mask)
        self._log(mode, self.step_log.critic(targets, loss_mask))
        if mode == "train" and not self.empty_steps.skip:
            n = len(rows) if args.rows_per_turn else len(kept)
            step, reduce = self.state.global_step, self._average_grads
            for stats in fit_critic(self.critic, forward, targets, n, settings, step, reduce):
                self._log(mode, stats)
        return targets.advantages

    def _average_grads(self, params):
        """Average the critic's gradients over processes (it is not wrapped in DDP)."""
        if self.accelerator.num_processes > 1:
            for p in params:
                if p.grad is not None:
                    p.grad = self.accelerator.reduce(p.grad, reduction="mean")

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

    def _log_rollout(self, mode, episodes, scored: Scored, advantages, trained_tokens: int, timings) -> None:
        """Metrics over the whole gathered batch ``episodes`` (the same on every process); ``advantages``
        are this process's kept episodes', gathered for the sample table; ``trained_tokens`` the tokens
        of this process's training rows (prompt + completion; with a context window, each turn's)."""
        args: StarPOConfig = self.args
        self._log(mode, self.step_log.rollout(episodes, scored, timings))
        if mode == "train":  # this step's rows, every process
            tokens = int(self._sum_over_processes(torch.tensor(float(trained_tokens), device=self.accelerator.device)))
            self.state.num_input_tokens_seen += tokens
            self._log(mode, {"rollout/tokens_trained": float(tokens)})
        # sample episodes for TRL's completions table (log_completions=True): whole conversations
        advantages = self._gather_episodes(advantages.tolist())
        for row in sample_rows([episodes[i] for i in scored.keep.tolist()], advantages, args.num_sample_episodes):
            for key in ("prompt", "completion", "advantages"):
                self._logs[key].append(row[key])
            self._logs["rewards"]["env"].append(row["reward"])
            for key in ("seed", "success", "turns"):
                self._logs["extra"][key].append(row[key])

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = trim_completion_padding(inputs)  # this micro-batch's own width, not the whole batch's
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # no policy gradient while the critic warms up (until it has learned), nor in a step whose advantages
        # are all 0 (no entropy-bonus-only gradient; that step is skipped too)
        critic_warmup = self.critic is not None and self.state.global_step < self.args.critic_warmup_steps
        if self.model.training and (critic_warmup or self.empty_steps.zero_advantage):
            return loss * 0.0
        return loss

    # -- checkpoints (``starpo_trl.checkpoints``: the critic, the run state, the rollout settings) ----------
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        run_state = {**self.step_log.state_dict(), **self.empty_steps.state_dict()}
        run_state.update(self.refiller.seeds.state_dict() if self.refiller is not None else {})
        save_checkpoint_extras(folder, self.critic, run_state, write=self.args.should_save)

    def _load_optimizer_and_scheduler(self, checkpoint):
        # Trainer calls this on every resume (DDP, DeepSpeed and FSDP alike), after the policy's weights
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            run_state = load_checkpoint_extras(checkpoint, self.critic)
            self.step_log.load_state_dict(run_state)
            self.empty_steps.load_state_dict(run_state)
            if self.refiller is not None:
                self.refiller.seeds.load_state_dict(run_state)

    def load_critic(self, checkpoint: str) -> None:
        """Restore the critic (weights and optimizer) saved in ``checkpoint/value_model``, if any."""
        load_critic(checkpoint, self.critic)

    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        critic = None if _internal_call else self.critic  # every process calls save_model, as Trainer expects
        save_model_extras(output_dir or self.args.output_dir, self.args, critic, write=self.args.should_save)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, **kwargs):
        """Write ``README.md`` (model card) to ``output_dir``: env, StarPO settings, evaluation table, recipe."""
        if self.is_world_process_zero():
            model = self.accelerator.unwrap_model(self.model)
            name = model_name or self.hub_model_id
            write_model_card(model, self.args, self.evaluation_results, self.recipe, name, self.args.output_dir)

    # -- held-out evaluation ----------------------------------------------------------------------------
    def evaluate_success(self, num_episodes: int | None = None, name: str | None = None) -> dict[str, float]:
        """Play the fixed held-out seeds at ``eval_temperature``; return episode metrics. With ``name``
        (e.g. ``"before RL"``) they are also kept for the model card's evaluation table."""
        args: StarPOConfig = self.args
        n = num_episodes or args.num_eval_episodes
        was_training = self.model.training
        self.model.eval()
        seeds = range(args.eval_seed_offset, args.eval_seed_offset + n)
        where = (self.accelerator.process_index, self.accelerator.num_processes, args.eval_rollout_batch_size)
        played = {}  # eval env name -> its episodes, every process's
        for env in args.eval_envs():
            calls = held_out_calls(env, seeds, *where)
            played[env.name] = self._gather_episodes([ep for s in calls for ep in self.play(s, args.eval_temperature)])
        self.model.train(was_training)
        self.last_eval_episodes = [ep for episodes in played.values() for ep in episodes]
        metrics = held_out_metrics(played)
        if name is not None:
            self.evaluation_results[name] = metrics
        return metrics

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        metrics = {f"{metric_key_prefix}_{k}": v for k, v in self.evaluate_success().items()}
        Trainer.log(self, metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics
