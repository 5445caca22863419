"""``StarPOConfig``: TRL's ``GRPOConfig`` plus every StarPO knob, with the paper's StarPO-S defaults."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields

from trl import GRPOConfig

from envs.contract import env_name
from starpo_trl.algorithms import get_estimator, num_kept_groups
from starpo_trl.algorithms.filters import GROUP_METRICS, STRATEGIES, TOP_P_MODES
from starpo_trl.algorithms.gigpo import GIGPO_MODES
from starpo_trl.algorithms.scoring import REWARD_FUNC_ERRORS
from starpo_trl.env_configs import EnvConfig, group_envs, parse_env_configs, split_groups
from starpo_trl.numeric_settings import Range, check_declared, check_numbers
from starpo_trl.rollout import RolloutConfig
from starpo_trl.rollout.engine import context_window_turns
from starpo_trl.rollout.shaping import ThinkShaping

FILTER_METRICS = (*GROUP_METRICS, "std_rev", "none")  # std_rev: std, smallest first; none: keep every group
# TRL loss types that divide by the whole batch's model-token count (num_items_in_batch): rows with no model
# token (the padding of a step whose kept count varies) change nothing. The others average per row or per
# micro-batch, which padding would dilute.
BATCH_TOKEN_NORMALISED_LOSSES = ("dapo", "cispo", "vespo")
# our names for how per-token losses are averaged -> the TRL loss_type that aggregates that way
# The settings that decide how an episode is played and evaluated: saved next to a trained model
# (ROLLOUT_SETTINGS_FILE), so evaluate.py plays it exactly as the trainer's held-out evaluation did.
ROLLOUT_SETTINGS = (
    "env_id",
    "env_kwargs",
    "eval_env_id",
    "eval_env_kwargs",
    "eval_env_configs",
    "eval_seed_offset",
    "num_eval_episodes",
    "eval_temperature",
    "max_turns",
    "max_actions_per_turn",
    "max_actions_per_episode",
    "max_tokens_per_turn",
    "max_episode_tokens",
    "context_window",
    "action_format",
    "reply_prefix",
    "format_instruction",
    "stop_strings",
    "enable_think",
    "format_penalty",
    "env_step_timeout",
    "env_runner",
    "think_bonus",
    "think_min_words",
    "think_max_words",
    "think_copy_penalty",
    "overlong_turns",
    "overlong_buffer",
    "overlong_penalty_factor",
)
ROLLOUT_SETTINGS_FILE = "starpo_rollout.json"
# the episode budgets: each at least 1 (checked here and by evaluate.py)
EPISODE_BUDGETS = (
    "max_turns",
    "max_actions_per_turn",
    "max_actions_per_episode",
    "max_tokens_per_turn",
    "max_episode_tokens",
)
LOSS_AGGREGATION = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum": "luspo"}


@dataclass
class StarPOConfig(GRPOConfig):
    r"""
    Configuration for [`MultiTurnStarPOTrainer`]. Every field of `trl.GRPOConfig` applies; the
    defaults below reproduce StarPO-S from the RAGEN paper (Qwen2.5-0.5B-Instruct, 200 steps).

    Parameters:
        > Environment

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
        rollout_filter_scope (`str`, `"per_env"`): with several training envs the filter ranks the
            groups of each env among themselves, its value applied per env (a quota: one env's
            variance cannot starve another), or the whole batch together (`global`).
        num_start_states (`int`, default 8): start states (groups) per rollout step. Each is played
            `num_generations` times (default 16), so one step generates 128 trajectories.
        train_seed_offset / num_train_seeds: training start states use seeds
            `[train_seed_offset, train_seed_offset + num_train_seeds)`.
        eval_seed_offset / num_eval_episodes (default 256): held-out start states, disjoint from
            training seeds by default.
        eval_rollout_batch_size (`int`, 256): held-out episodes played per engine call on each
            process; the memory of an evaluation grows with episodes x history (256 five-turn
            FrozenLake episodes of SmolLM2-135M on CPU: over 8 GB), so lower it if it runs out.

        > Episodes

        max_turns (5), max_actions_per_turn (5), max_actions_per_episode (10): the action budgets.
        max_tokens_per_turn (`int`, 256): cap on tokens generated in one turn.
        max_episode_tokens (`int`, 2048): cap on completion tokens (model + env) of one episode;
            an episode that would pass it is cut at a turn boundary.
        context_window (`str`, `"full"`): what the model reads at each turn: `full` (the whole
            history), `window:K` (a fresh first message with the state K turns ago, then the last K
            turns' tokens as they were), `single_turn` (a fresh first message with the current state
            only). With a window each turn is its own training row (the tokens it was sampled from,
            then the reply), carrying its trajectory's advantage (with a critic: its own per-token
            advantages, from values on that row's context and GAE over the episode's replies in
            turn order); the loss must divide by the batch's model tokens (`loss_type` dapo, the
            default).
        action_format (`str`, `"answer_tags"`): how a reply acts. `answer_tags`:
            `<think>...</think><answer>...</answer>`, the answer split into actions. `tool_call`: the
            reply's tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the format of
            Qwen/Hermes templates), each run by the env, their results appended as the template's tool
            messages (env tokens); a reply without a call is the final answer and ends the episode. For
            TRL-style environment classes (`envs.trl_env.register_trl_environment`); malformed calls
            and unknown tools get the format penalty. Needs a template that renders tool calls.
        enable_think (`bool`, True): ask for `<think>...</think><answer>...</answer>`.
        reply_prefix (`str`, `""`): text every reply starts with, written into the prompt after the
            template's assistant header (env tokens: not sampled, not trained); the parser reads it
            with the reply. `auto`: `<think>` with `enable_think`, else `<answer>`, the opening tag
            RAGEN forces on every reply; a model too small to find the format by itself then only
            has to continue it. Saved with the model, so `evaluate.py` plays as training did.
        format_instruction (`str` or `None`): the line that ends every user message, in place of
            the paper's "Always output: <answer> [your answer] </answer> with no extra text."; may
            name `{example_action}` (the env's first action name) and `{actions}` (its action names:
            `{actions}` lists them, `{actions[i]}` names one), for envs with named actions.
        stop_strings (`list[str]` or `None`): a reply ends with the first token that completes one of
            these in its text (kept, as vLLM's `include_stop_str_in_output`); what was sampled after
            it is dropped and the turn closed with the end-of-turn token, as a reply cut at
            `max_tokens_per_turn` is. `["</answer>"]` stops a model that goes on writing after its
            answer (text the loss and an entropy bonus would otherwise see).
        format_penalty (`float`, -0.1): added to a turn's reward when its reply is unparseable or
            names an unknown action.
        overlong_turns (`str`, `"keep"`): a reply that reached its token limit with neither an
            end-of-turn token nor a stop string (logged as `rollout/cut_turn_fraction`) is trained as any
            other (`keep`, TRL's default), left out of the loss (`mask`, TRL's `mask_truncated_completions`
            per turn), or penalised (`penalty`: DAPO's soft overlong penalty per turn, 0 up to
            `max_tokens_per_turn - overlong_buffer` reply tokens, then falling linearly to
            `-overlong_penalty_factor` at the limit; with `overlong_buffer` 0 the whole factor on a reply
            that reached the limit).
        eval_temperature (`float`, 0.5): sampling temperature of held-out evaluation.
        num_sample_episodes (`int`, 4): kept episodes per step (spread over the kept groups) whose
            whole conversation goes to TRL's completions table with `log_completions=True`
            (printed, saved as parquet, and sent to wandb / trackio).
        env_step_timeout (`float` or `None`): seconds an env reset/step may take; a slower one ends
            its episode and its worker process is killed (needs `env_runner="processes"`, the default
            when a timeout is set). `None`: no limit.
        env_runner (`str` or `None`): where env calls run (`starpo_trl.rollout.env_runner`): `inline` (in the
            trainer's process, one episode after another), `threads` (the episodes of a turn stepped
            concurrently on threads: I/O-bound envs), `processes` (each env in a worker process, stepped
            concurrently; a call past `env_step_timeout` kills its worker). `None`: `processes` when
            `env_step_timeout` is set, else `inline`.
        env_error_policy (`str`, `"exclude"`): what an episode whose env raised, timed out or paid
            a non-finite reward becomes: `exclude` (out of the loss and of its group's statistics)
            or `failure_reward` (trained on, with reward `env_failure_reward`, default 0.0).
        reward_func_errors (`str`, `"raise"`): a `reward_funcs` function (see `MultiTurnStarPOTrainer`)
            that raises or returns other than one number per episode stops training with an error that
            names it (`raise`), or ends every episode of that call as an env error (`mark`: counted in
            `env/errors`, then `env_error_policy`). A NaN or infinite reward from one ends that episode
            as an env error either way.
        vllm_lora_sync (`bool`, False): with LoRA and `vllm_mode="colocate"`, push only the adapter
            to vLLM before each rollout (vLLM's LoRA support) instead of TRL's merged full weights
            (see `starpo_trl.rollout.lora_sync`). Not with `vllm_enable_sleep_mode`.

        > StarPO-S

        rollout_filter_strategy (`str`, `"top_k"`): how groups are kept, by their score (see
            `starpo_trl.algorithms.filters`), with `rollout_filter_ratio` as its value: `top_k` (that
            share of groups, rounded up: the paper's rule), `top_k_abs` (that many groups), `top_p`
            (`linear`: best first until the cumulative score reaches `ratio * sum - rollout_filter_eps`;
            `softmax`: until the softmax mass reaches `ratio`), `min_p` (score >= `ratio` x the best).
        rollout_filter_ratio (`float`, 0.25): the strategy's value. With `top_k`, 1.0 keeps all (plain GRPO).
        rollout_filter_metric (`str`, `"std"`): the group score, on raw rewards: `std` of the in-group
            reward; `reward_variance`, RAGEN's name, computed as RAGEN's code does (the in-group std: the
            same as `std`); `variance` (the std squared: ranks as `std`, but shares of the total differ for
            linear `top_p` and `min_p`); `mean` reward, `entropy` (mean -log p of the
            sampled model tokens), `length` (model tokens per episode); `none` keeps every group;
            `std_rev` is `std` with `smallest`. RAGEN's current recommendation: `reward_variance`,
            `top_p` 0.9 `linear`, `rollout_filter_include_zero=False` (`recipes/sokoban-qwen2.5-0.5b-ragen2.yaml`).
        rollout_filter_type (`str`, `"largest"`): keep the highest scores, or the `smallest`.
        rollout_filter_include_zero (`bool`, True): False never keeps a zero-score group.
        rollout_filter_top_p_mode (`str`, `"linear"`) / rollout_filter_eps (`float`, 0.01): see `top_p`.
        When the number of kept groups can vary (`top_p`, `min_p`, or `include_zero=False`), the
        kept rows are dealt evenly to the processes (the lowest-ranked groups dropped until they
        divide) and each process pads its share with copies that hold no model token up to a
        multiple of `steps_per_generation`; the loss must then divide by the batch's token count
        (`loss_type` dapo, cispo or vespo; the default), so padding changes nothing. A step that keeps
        nothing is skipped (`rollout/empty_after_filter`).
        rollout_filter_empty_stop_steps (`int`, 5): that many such steps in a row stop training.
        rollout_filter_refill (`bool`, False): dynamic sampling. When a training step's filter keeps fewer
            groups than `refill_groups()`, play further rounds from new start states (training seeds not
            played before in the run; as many groups per round as `num_start_states`, each round filtered on
            its own) until it has them or `rollout_filter_max_rounds` rounds were played, then train on
            the best that many by the filter's score (or all, when fewer). Needs a filter that can keep
            fewer (`rollout_filter_include_zero=False`, or `top_p` / `min_p`). Logged: `rollout/refill_rounds`,
            `rollout/groups_generated`, `rollout/groups_generated_per_kept`, `rollout/refill_short`.
            Held-out evaluation never refills (see `starpo_trl.refill`).
        rollout_filter_max_rounds (`int`, 4): rounds a refilled step plays at most, the first included.
        rollout_filter_refill_groups (`int`, None): the kept-group count a refill aims at, at most
            `num_start_states`; None: the strategy's own count (`top_k`: `ceil(ratio x num_start_states)`
            per env scope, `top_k_abs`: `ratio`), or `num_start_states` with `top_p` / `min_p`.

        > Advantages and the critic

        advantage_estimator (`str`, `"grpo"`): `grpo` (group mean/std), `rloo` (leave-one-out
            baseline), `reinforce_pp` (REINFORCE++: batch mean/std, so a group whose rewards agree
            still learns against the rest of the batch; needs `scale_rewards` `batch` or `none`),
            `gae` (critic, token-level GAE over model tokens), `bilevel_gae` (GAE across turns with
            `turn_gamma`, then token-level GAE inside each turn), `turn_gae` (every token of a turn
            gets its turn's advantage), `gigpo` (no critic: the episode's advantage in its group plus
            `step_advantage_weight` x its turn's discounted return (`turn_gamma`) against the turns of
            the group that started from the same state; `gigpo_mode` `mean_norm` or `mean_std_norm`;
            see `starpo_trl.algorithms.gigpo`).
        gamma / lam (`float`, 1.0 / 1.0): token-level GAE discount and lambda (paper: 1.0 / 1.0).
        turn_gamma (`float`, 0.95) / turn_lambda (`float` or `None` = `lam`): turn-level GAE.
        use_turn_rewards (`bool`, False): put each turn's reward on its last model token instead of
            the whole episode's reward on the last one.
        reward_normalization (`str`, `"identity"`): `identity`, `mean`, `mean_std` or `asym_clip`,
            applied per `reward_norm_scope` (`group` or `batch`) AFTER the variance filter.
        critic_type (`str`, `"full"`): `full` (a copy of the policy) or `lora` (a second LoRA
            adapter on the policy's base; needs PEFT).
        critic_learning_rate (`float`, 1e-5), value_clip (`float`, 0.5), critic_warmup_steps (`int`,
            0: steps that train only the critic).
        whiten_advantages (`bool`, True): with a critic estimator, whiten the per-token advantages
            over the model tokens of the whole kept batch (all processes) before the loss:
            `(A - mean) / std`, as RAGEN, VAGEN and verl do. GRPO / RLOO advantages are not touched.
        value_loss_tokens (`str`, `"all"`): where the critic is trained: `all` model tokens (each with
            its return), or `turn_ends` (only each turn's last model token, whose target is the turn
            return `G_k`, as VAGEN trains its critic). Explained variance is logged on the same tokens.
        critic_epochs (`int`, 1): passes of the critic over each rollout batch (PPO's value
            epochs), each in a new random order and split into `steps_per_generation` micro-batches;
            they run before the policy's update, whatever `num_iterations` is.
        loss_aggregation (`str` or `None`): `token-mean` (TRL `dapo`), `seq-mean-token-mean`
            (TRL `grpo`: every trajectory weighs the same) or `seq-mean-token-sum` (TRL `luspo`);
            sets `loss_type`. `None` keeps `loss_type` as given.

        max_empty_steps (`int`, 5): a step whose kept batch holds no model token (every kept episode
            failed in `reset`) is skipped: no optimizer update, `rollout/empty_step` logged as 1. After
            this many such steps in a row training stops with an error.
        skip_zero_advantage_steps (`bool`, False): a step whose kept episodes all have advantage
            exactly 0 (every group agreed, or with `reinforce_pp` the whole batch) makes no optimizer
            update either, `rollout/zero_advantage_step` logged as 1. Without it the step's only
            gradient is the entropy bonus (and the KL term), which AdamW scales to a full-size step
            in no direction the reward chose: with `entropy_coef` 0.05 two such steps took a policy
            that solved every training prompt to one name per pair (docs/real-model.md). Group
            estimators only; never stops training (a solved task keeps being sampled, cheaply).

        > Collapse guard (see `starpo_trl.monitoring.guard`)

        collapse_guard (`str`, `"warn"`): `off`, `warn` (log the event), `stop` (also save the last
            healthy weights to `output_dir/last-healthy` and stop) or `rollback` (also load them back
            into the model, then stop).
        collapse_guard_warmup_steps (`int`, 10): logs that define each signal's early level.
        collapse_guard_smoothing (`float`, 0.3): EMA weight of the newest value.
        collapse_guard_reward_std_fraction (`float`, 0.4) / collapse_guard_entropy_fraction (`float`,
            0.4): warn when the smoothed in-group reward std / entropy falls below this fraction of
            its early level.
        collapse_guard_grad_norm_spike (`float`, 5.0): warn when a grad norm exceeds this many times
            its running mean.
        collapse_guard_diversity_fraction (`float`, 0.5) / collapse_guard_diversity_floor (`float`,
            0.0: off): warn when smoothed distinct-2 of the think texts falls below this fraction of
            its early level, or below this absolute floor.
        collapse_guard_retrieval_fraction (`float`, 0.5) / collapse_guard_retrieval_warmup (`int`, 3):
            warn when the smoothed retrieval accuracy of the MI metrics falls below this fraction of
            the mean of its first values (needs `mi_metrics_every`).
        collapse_guard_patience (`int`, 2): logs in a row a rule must hold.
        collapse_guard_snapshot_steps (`int`, 5): with `stop`/`rollback`, keep a CPU copy of the
            trained weights every this many healthy steps (the "last healthy" state).

        mi_metrics_every (`int`, 10): every this many steps, the mutual-information collapse metrics
            (`collapse/mi_estimate`, `collapse/conditional_entropy`, `collapse/reasoning_entropy`,
            `collapse/retrieval_accuracy`, `collapse/mi_zscore`, see `starpo_trl.monitoring.mutual_info`)
            on `mi_metrics_inputs` start states x `mi_metrics_per_input` reasonings of the rollout
            (`mi_metrics_turn`: each episode's `first` turn or a `uniform` one); 0 turns them off.
        mi_metrics_shared_prefix (`bool`, True): the MI pass reads each input once and scores every
            reasoning under it from a copy of its key-value cache (about `Nz` times cheaper than reading
            each input + reasoning whole, which `False` does: for a model whose cache cannot be extended).

        > Reasoning-aware reward shaping (off by default)

        think_bonus (`float`, 0.0): added to a turn whose think text has between `think_min_words`
            (1) and `think_max_words` (100) words.
        think_copy_penalty (`float`, 0.0): subtracted from a turn whose think text repeats the
            previous turn's verbatim (whitespace-normalised).
        A per-turn `reasoning_reward_fn(think, answer, previous_think, turn) -> float` can be passed
        to `MultiTurnStarPOTrainer`.
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
    rollout_filter_scope: str = field(
        default="per_env", metadata={"help": "Several envs: filter per_env (a quota) or global."}
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

    max_turns: int = field(default=5, metadata={"help": "Maximum turns per episode."})
    max_actions_per_turn: int = field(default=5, metadata={"help": "Maximum actions executed per turn."})
    max_actions_per_episode: int = field(default=10, metadata={"help": "Maximum actions executed per episode."})
    max_tokens_per_turn: int = field(default=256, metadata={"help": "Maximum tokens generated in one turn."})
    max_episode_tokens: int = field(
        default=2048, metadata={"help": "Maximum completion tokens (model + env) per episode."}
    )
    context_window: str = field(
        default="full", metadata={"help": "What each turn reads: full, window:K or single_turn."}
    )
    action_format: str = field(
        default="answer_tags", metadata={"help": "How a reply acts: answer_tags or tool_call (TRL-style envs)."}
    )
    enable_think: bool = field(default=True, metadata={"help": "Ask for <think>...</think><answer>...</answer>."})
    reply_prefix: str = field(
        default="",
        metadata={"help": "Text every reply starts with, given in the prompt; auto: <think> or <answer>."},
    )
    format_instruction: str | None = field(
        default=None,
        metadata={
            "help": "The format line ending each user message (may name {example_action}, {actions}); None: the paper's."
        },
    )
    stop_strings: list[str] | None = field(
        default=None, metadata={"help": "A reply ends after the first of these it writes (kept), e.g. </answer>."}
    )
    format_penalty: float = field(
        default=-0.1, metadata={"help": "Reward added to a turn with an unparseable reply or unknown action."}
    )
    overlong_turns: str = field(
        default="keep",
        metadata={"help": "A reply cut by its token limit: keep (trained as any), mask (out of the loss) or penalty."},
    )
    overlong_buffer: int = field(
        default=0,
        metadata={"help": "penalty: the last this many tokens of max_tokens_per_turn ramp it to the factor."},
    )
    overlong_penalty_factor: float = field(
        default=1.0, metadata={"help": "penalty: the most subtracted from a turn's reward (DAPO's soft overlong)."}
    )
    eval_temperature: float = field(default=0.5, metadata={"help": "Sampling temperature for held-out evaluation."})
    num_sample_episodes: int = field(
        default=4, metadata={"help": "Episodes per step in the completions table (log_completions)."}
    )
    env_step_timeout: float | None = field(
        default=None, metadata={"help": "Seconds an env reset/step may take (None: no limit)."}
    )
    env_runner: str | None = field(
        default=None,
        metadata={"help": "inline, threads or processes (None: processes with env_step_timeout, else inline)."},
    )
    env_error_policy: str = field(
        default="exclude", metadata={"help": "exclude or failure_reward, for episodes whose env failed."}
    )
    env_failure_reward: float = field(
        default=0.0, metadata={"help": "Reward of a failed episode under env_error_policy=failure_reward."}
    )
    reward_func_errors: str = field(
        default="raise",
        metadata={
            "help": "A reward function that raises: raise (stop, naming it) or mark (its episodes end as env errors)."
        },
    )
    vllm_lora_sync: bool = field(
        default=False, metadata={"help": "LoRA + vLLM colocate: push only the adapter to vLLM each step."}
    )

    rollout_filter_ratio: float = field(
        default=0.25, metadata={"help": "The filter's value: top_k share, top_k_abs count, top_p p, min_p fraction."}
    )
    rollout_filter_strategy: str = field(default="top_k", metadata={"help": "top_k, top_k_abs, top_p or min_p."})
    rollout_filter_metric: str = field(
        default="std",
        metadata={
            "help": "Group score: std, reward_variance (RAGEN's: the std), variance, mean, entropy, length (or std_rev, none)."
        },
    )
    rollout_filter_type: str = field(default="largest", metadata={"help": "Keep the largest or smallest scores."})
    rollout_filter_include_zero: bool = field(default=True, metadata={"help": "False never keeps zero-score groups."})
    rollout_filter_top_p_mode: str = field(default="linear", metadata={"help": "top_p mass: linear or softmax."})
    rollout_filter_eps: float = field(default=0.01, metadata={"help": "top_p linear: threshold slack."})
    rollout_filter_empty_stop_steps: int = field(
        default=5, metadata={"help": "Stop after this many steps in a row whose filter kept nothing."}
    )
    rollout_filter_refill: bool = field(
        default=False,
        metadata={"help": "Play more rounds from new start states while the filter keeps too few groups."},
    )
    rollout_filter_max_rounds: int = field(default=4, metadata={"help": "Refill: rounds per step at most."})
    rollout_filter_refill_groups: int | None = field(
        default=None, metadata={"help": "Refill: kept groups to reach (default: the strategy's count)."}
    )

    advantage_estimator: str = field(
        default="grpo", metadata={"help": "grpo, rloo, reinforce_pp, gae, bilevel_gae or turn_gae."}
    )
    gamma: float = field(default=1.0, metadata={"help": "Token-level GAE discount."})
    lam: float = field(default=1.0, metadata={"help": "Token-level GAE lambda."})
    turn_gamma: float = field(default=0.95, metadata={"help": "Turn-level discount of bi-level GAE."})
    turn_lambda: float | None = field(
        default=None, metadata={"help": "Turn-level lambda of bi-level GAE (default: lam)."}
    )
    gigpo_mode: str = field(
        default="mean_norm",
        metadata={"help": "GiGPO: mean_norm (minus the group mean) or mean_std_norm (then / std)."},
    )
    step_advantage_weight: float = field(
        default=1.0, metadata={"help": "GiGPO: weight of the turn-level (anchor state) advantage."}
    )
    use_turn_rewards: bool = field(default=False, metadata={"help": "Each turn's reward on its last model token."})
    reward_normalization: str = field(
        default="identity", metadata={"help": "identity, mean, mean_std or asym_clip (after filtering)."}
    )
    reward_norm_scope: str = field(default="group", metadata={"help": "Normalise rewards per group or per batch."})
    critic_type: str = field(
        default="full", metadata={"help": "full (copy of the policy) or lora (value adapter, needs PEFT)."}
    )
    critic_learning_rate: float = field(default=1e-5, metadata={"help": "Critic learning rate."})
    value_clip: float | None = field(default=0.5, metadata={"help": "Value clipping range (None: no clipping)."})
    critic_warmup_steps: int = field(default=0, metadata={"help": "First steps train only the critic."})
    whiten_advantages: bool = field(
        default=True, metadata={"help": "Whiten critic advantages over the batch's model tokens."}
    )
    value_loss_tokens: str = field(
        default="all", metadata={"help": "Critic trained on all model tokens or only turn_ends."}
    )
    max_empty_steps: int = field(
        default=5, metadata={"help": "Stop after this many steps in a row with no model token to train on."}
    )
    skip_zero_advantage_steps: bool = field(
        default=False,
        metadata={"help": "No optimizer update in a step whose advantages are all 0 (group estimators)."},
    )
    critic_epochs: int = field(
        default=1, metadata={"help": "Critic passes over each rollout batch, in shuffled micro-batches."}
    )
    loss_aggregation: str | None = field(
        default=None, metadata={"help": "token-mean, seq-mean-token-mean or seq-mean-token-sum."}
    )

    collapse_guard: str = field(default="warn", metadata={"help": "off, warn, stop or rollback."})
    collapse_guard_warmup_steps: int = field(
        default=10, metadata={"help": "Logs that define each signal's early level."}
    )
    collapse_guard_smoothing: float = field(default=0.3, metadata={"help": "EMA weight of the newest value."})
    collapse_guard_reward_std_fraction: float = field(
        default=0.4, metadata={"help": "Warn below this fraction of the early in-group reward std."}
    )
    collapse_guard_entropy_fraction: float = field(
        default=0.4, metadata={"help": "Warn below this fraction of the early entropy."}
    )
    collapse_guard_grad_norm_spike: float = field(
        default=5.0, metadata={"help": "Warn when grad norm exceeds this many times its running mean."}
    )
    collapse_guard_diversity_fraction: float = field(
        default=0.5, metadata={"help": "Warn below this fraction of the early distinct-2 of think texts."}
    )
    collapse_guard_diversity_floor: float = field(
        default=0.0, metadata={"help": "Warn when smoothed distinct-2 of think texts falls below (0: off)."}
    )
    collapse_guard_retrieval_fraction: float = field(
        default=0.5, metadata={"help": "Warn below this fraction of the early MI retrieval accuracy."}
    )
    collapse_guard_retrieval_warmup: int = field(
        default=3, metadata={"help": "MI logs that define the retrieval accuracy's early level."}
    )
    collapse_guard_patience: int = field(default=2, metadata={"help": "Logs in a row a rule must hold to warn."})
    mi_metrics_every: int = field(
        default=10, metadata={"help": "Mutual-information collapse metrics every this many steps (0: off)."}
    )
    mi_metrics_turn: str = field(default="first", metadata={"help": "MI pairs from the first turn or a uniform one."})
    mi_metrics_inputs: int = field(default=8, metadata={"help": "Start states (inputs) in the MI sample."})
    mi_metrics_per_input: int = field(default=2, metadata={"help": "Reasonings per input in the MI sample."})
    mi_metrics_shared_prefix: bool = field(
        default=True, metadata={"help": "MI pass reads each input once and reuses its KV cache for every reasoning."}
    )
    collapse_guard_snapshot_steps: int = field(
        default=5, metadata={"help": "Healthy steps between CPU snapshots (stop/rollback)."}
    )

    think_bonus: float = field(
        default=0.0, metadata={"help": "Reward for a think text within the word bounds (0: off)."}
    )
    think_min_words: int = field(default=1, metadata={"help": "Fewest words of a think text that earns think_bonus."})
    think_max_words: int = field(default=100, metadata={"help": "Most words of a think text that earns think_bonus."})
    think_copy_penalty: float = field(
        default=0.0, metadata={"help": "Penalty for repeating the previous turn's think verbatim (0: off)."}
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
        check_numbers(self, NUMBER_RANGES, own_only=True, with_range=False)  # numbers of the declared kind, finite
        self._parse_env_kwargs()
        self._check_ranges()
        self._check_envs()
        self._check_rollout_settings()
        self._check_training_settings()
        check_numbers(self, NUMBER_RANGES, own_only=True)  # each in its range (the checks above say more for some)
        if self.bf16 is None and not self.fp16:
            import torch

            # TRL turns bf16 on by default; on a machine without a bf16 GPU train in fp32 instead of failing.
            self.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        if self.generation_batch_size is None and self.steps_per_generation is None:
            self.generation_batch_size = self.num_start_states * self.num_generations
        super().__post_init__()
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
            self.env_id, self.env_kwargs = configs[0].env_id, configs[0].env_kwargs  # the first: the guard watches it
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
        if self.rollout_filter_scope not in ("per_env", "global"):
            raise ValueError(f"rollout_filter_scope must be 'per_env' or 'global', got {self.rollout_filter_scope!r}")

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
        """The env ids exist, their kwargs fit and the envs keep the text-env contract; env-call settings."""
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
        if self.reward_func_errors not in REWARD_FUNC_ERRORS:
            raise ValueError(
                f"reward_func_errors must be one of {REWARD_FUNC_ERRORS}, got {self.reward_func_errors!r}"
            )
        if self.env_error_policy not in ("exclude", "failure_reward"):
            raise ValueError(f"env_error_policy must be 'exclude' or 'failure_reward', got {self.env_error_policy!r}")
        from starpo_trl.rollout.env_runner import RUNNERS

        if self.env_runner is not None and self.env_runner not in RUNNERS:
            raise ValueError(f"env_runner must be one of {RUNNERS} (or unset), got {self.env_runner!r}")
        if self.env_step_timeout is not None and self.env_runner not in (None, "processes"):
            raise ValueError(
                f"env_step_timeout needs env_runner='processes' (got {self.env_runner!r}): a hung env call can only be stopped "
                "by killing its worker process. Leave env_runner unset or set it to processes."
            )

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

    def _check_rollout_settings(self) -> None:
        """The filter and the episode budgets."""
        if self.value_loss_tokens not in ("all", "turn_ends"):
            raise ValueError(f"value_loss_tokens must be 'all' or 'turn_ends', got {self.value_loss_tokens!r}")
        if self.rollout_filter_metric not in FILTER_METRICS:
            raise ValueError(
                f"rollout_filter_metric must be one of {FILTER_METRICS}, got {self.rollout_filter_metric!r}"
            )
        self._check_filter_strategy()
        context_window_turns(self.context_window)  # a bad value fails here, naming the forms
        if self.action_format not in ("answer_tags", "tool_call"):
            raise ValueError(f"action_format must be 'answer_tags' or 'tool_call', got {self.action_format!r}")
        if self.action_format == "tool_call" and self.context_window != "full":
            raise ValueError("action_format='tool_call' keeps the whole history: use context_window='full'.")
        if self.stop_strings is not None and (
            isinstance(self.stop_strings, str) or not all(isinstance(x, str) and x for x in self.stop_strings)
        ):
            raise ValueError(f"stop_strings must be a list of non-empty strings, got {self.stop_strings!r}")
        if self.action_format == "tool_call" and self.reply_prefix:
            raise ValueError(
                "reply_prefix opens <think>/<answer> replies: leave it empty with action_format='tool_call'."
            )
        if self.overlong_turns not in ("keep", "mask", "penalty"):
            raise ValueError(f"overlong_turns must be keep, mask or penalty, got {self.overlong_turns!r}")
        if self.overlong_buffer > self.max_tokens_per_turn:
            raise ValueError(
                f"overlong_buffer={self.overlong_buffer} is more than max_tokens_per_turn={self.max_tokens_per_turn}: "
                "the penalty ramps over the last overlong_buffer tokens of a turn's budget."
            )
        if self.mi_metrics_turn not in ("first", "uniform"):
            raise ValueError(f"mi_metrics_turn must be 'first' or 'uniform', got {self.mi_metrics_turn!r}")
        for name in ("mi_metrics_every",):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: off), got {getattr(self, name)}")
        for name in ("mi_metrics_inputs", "mi_metrics_per_input"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in (*EPISODE_BUDGETS, "num_start_states"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_completion_length is None or self.max_completion_length < self.max_episode_tokens:
            self.max_completion_length = self.max_episode_tokens

    def _check_training_settings(self) -> None:
        """Advantage estimator, reward normalisation, collapse guard, reasoning shaping, critic, vLLM LoRA sync, loss."""
        self._check_estimator()
        if self.reward_normalization not in ("identity", "mean", "mean_std", "asym_clip"):
            raise ValueError(
                f"reward_normalization must be identity, mean, mean_std or asym_clip, got {self.reward_normalization!r}"
            )
        if self.reward_norm_scope not in ("group", "batch"):
            raise ValueError(f"reward_norm_scope must be group or batch, got {self.reward_norm_scope!r}")
        if self.use_turn_rewards and self.reward_normalization == "asym_clip":
            raise ValueError(
                "reward_normalization='asym_clip' cannot be split over turns: use mean_std with use_turn_rewards, or turn rewards off."
            )
        from starpo_trl.monitoring.guard import GUARD_ACTIONS

        if self.collapse_guard not in GUARD_ACTIONS:
            raise ValueError(f"collapse_guard must be one of {GUARD_ACTIONS}, got {self.collapse_guard!r}")
        for name in ("collapse_guard_warmup_steps", "collapse_guard_patience", "collapse_guard_snapshot_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 < self.collapse_guard_smoothing <= 1.0:
            raise ValueError(f"collapse_guard_smoothing must be in (0, 1], got {self.collapse_guard_smoothing}")
        if self.think_bonus < 0 or self.think_copy_penalty < 0:
            raise ValueError(
                "think_bonus and think_copy_penalty are magnitudes: give them >= 0 (the penalty is subtracted)."
            )
        if not 0 <= self.think_min_words <= self.think_max_words:
            raise ValueError(
                f"need 0 <= think_min_words <= think_max_words, got {self.think_min_words} and {self.think_max_words}"
            )
        if self.critic_type not in ("full", "lora"):
            raise ValueError(f"critic_type must be full or lora, got {self.critic_type!r}")
        if self.vllm_lora_sync and not (self.use_vllm and self.vllm_mode == "colocate"):
            raise ValueError(
                "vllm_lora_sync pushes the LoRA adapter into a colocated vLLM engine: set use_vllm=True and vllm_mode='colocate' "
                "(trl vllm-serve cannot load adapters), or leave vllm_lora_sync=False."
            )
        if self.vllm_lora_sync and self.vllm_enable_sleep_mode:
            raise ValueError(
                "vllm_lora_sync cannot be combined with vllm_enable_sleep_mode (waking re-pushes merged weights): turn one off."
            )
        if self.critic_epochs < 1:
            raise ValueError(f"critic_epochs must be at least 1, got {self.critic_epochs}")
        if self.loss_aggregation is not None:
            if self.loss_aggregation not in LOSS_AGGREGATION:
                raise ValueError(
                    f"loss_aggregation must be one of {sorted(LOSS_AGGREGATION)}, got {self.loss_aggregation!r}"
                )
            self.loss_type = LOSS_AGGREGATION[self.loss_aggregation]

    def _check_estimator(self) -> None:
        """The advantage estimator and the settings that depend on it."""
        estimator = get_estimator(self.advantage_estimator)  # unknown names fail here, listing the registered ones
        if self.gigpo_mode not in GIGPO_MODES:
            raise ValueError(f"gigpo_mode must be one of {GIGPO_MODES}, got {self.gigpo_mode!r}")
        if self.skip_zero_advantage_steps and (estimator.critic or estimator.per_turn):
            raise ValueError(
                f"skip_zero_advantage_steps needs a group estimator (grpo, rloo, reinforce_pp): with "
                f"{self.advantage_estimator!r} the advantages are per token (a critic's, or GiGPO's per turn)."
            )
        if self.advantage_estimator == "reinforce_pp" and self.scale_rewards not in ("batch", "none", False):
            raise ValueError(
                f"advantage_estimator='reinforce_pp' takes its baseline and std over the whole batch: set "
                f"scale_rewards to 'batch' or 'none' (got {self.scale_rewards!r})."
            )

    def _check_filter_strategy(self) -> None:
        strategy, value = self.rollout_filter_strategy, self.rollout_filter_ratio
        for name, allowed in (
            ("rollout_filter_strategy", STRATEGIES),
            ("rollout_filter_type", ("largest", "smallest")),
            ("rollout_filter_top_p_mode", TOP_P_MODES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if strategy == "top_k_abs":
            if value < 1 or value != int(value):
                raise ValueError(
                    f"rollout_filter_ratio={value} with top_k_abs is the number of groups kept: use a whole number >= 1."
                )
            ranked = (
                split_groups(self.train_envs(), self.num_start_states)
                if self.env_configs is not None and self.rollout_filter_scope == "per_env"
                else [self.num_start_states]
            )
            if value > max(ranked):
                raise ValueError(
                    f"rollout_filter_ratio={value:g} with top_k_abs keeps that many groups, but the filter ranks "
                    f"{max(ranked)} at most ({'per env: ' + str(ranked) if len(ranked) > 1 else 'num_start_states'}): "
                    "give at most that many (or rollout_filter_ratio=1.0 with top_k to keep every group)."
                )
        elif not 0.0 < value <= 1.0:
            raise ValueError(
                f"rollout_filter_ratio={value} keeps no group: with {strategy} use a value in (0, 1] "
                "(top_k 0.25 keeps the top quarter of groups; 1.0 disables the filter)."
            )
        if self.rollout_filter_empty_stop_steps < 1:
            raise ValueError(
                f"rollout_filter_empty_stop_steps must be at least 1, got {self.rollout_filter_empty_stop_steps}"
            )
        uses_shares = (strategy == "top_p" and self.rollout_filter_top_p_mode == "linear") or strategy == "min_p"
        if uses_shares and self.rollout_filter_metric == "mean":
            raise ValueError(
                f"{strategy} compares shares of the group scores, and mean rewards can be negative: use the "
                "softmax top_p mode or top_k with rollout_filter_metric='mean', or another metric."
            )
        if (
            strategy == "top_p"
            and self.rollout_filter_top_p_mode == "linear"
            and self.rollout_filter_type == "smallest"
        ):
            raise ValueError(
                "top_p linear keeps a share of the score mass from the top: use largest, or softmax mode."
            )
        if self.rollout_filter_eps < 0:
            raise ValueError(f"rollout_filter_eps must be >= 0, got {self.rollout_filter_eps}")
        self._check_refill()

    def _check_refill(self) -> None:
        if not self.rollout_filter_refill:
            return
        if self.fixed_kept_groups() is not None:
            raise ValueError(
                f"rollout_filter_refill=True never refills: rollout_filter_metric={self.rollout_filter_metric!r} with "
                f"{self.rollout_filter_strategy!r} and include_zero={self.rollout_filter_include_zero} keeps the same "
                "number of groups every step. Set rollout_filter_include_zero=False (zero-variance groups are dropped, "
                "then replaced) or use top_p / min_p, or turn the refill off."
            )
        if self.rollout_filter_max_rounds < 2:
            raise ValueError(
                f"rollout_filter_max_rounds={self.rollout_filter_max_rounds} plays no extra round: set it to 2 or more "
                "with rollout_filter_refill=True."
            )
        target = self.rollout_filter_refill_groups
        if target is not None and not 1 <= target <= self.num_start_states:
            raise ValueError(
                f"rollout_filter_refill_groups={target} must be between 1 and num_start_states={self.num_start_states} "
                "(a step trains on at most as many groups as one round plays)."
            )

    def fixed_kept_groups(self) -> int | None:
        """How many groups every step keeps, or None when the filter's strategy lets it vary."""
        if self.rollout_filter_metric == "none":
            return self.num_start_states
        if not self.rollout_filter_include_zero or self.rollout_filter_strategy in ("top_p", "min_p"):
            return None
        return self._strategy_count()

    def refill_groups(self) -> int:
        """The kept-group count a refilled step aims at (``rollout_filter_refill_groups``)."""
        if self.rollout_filter_refill_groups is not None:
            return self.rollout_filter_refill_groups
        if self.rollout_filter_strategy in ("top_p", "min_p"):
            return self.num_start_states
        return self._strategy_count()

    def _strategy_count(self) -> int:
        """The groups ``top_k`` / ``top_k_abs`` keep when every group is a candidate."""
        groups = self.num_start_states
        per_env = (
            split_groups(self.train_envs(), groups)
            if self.env_configs is not None and self.rollout_filter_scope == "per_env"
            else [groups]
        )
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
        if context_window_turns(self.context_window) is not None:  # rows per turn: their count varies
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

    def _check_ranges(self) -> None:
        """Numeric settings outside their meaningful range fail here, before any model loads.

        Longer than the project's 60 lines on purpose: a flat list of independent checks, one per setting."""
        for name in ("gamma", "lam", "turn_gamma", "turn_lambda"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is a discount / GAE weight in [0, 1], got {value}")
        if not self.temperature > 0 or not math.isfinite(self.temperature):
            raise ValueError(
                f"temperature={self.temperature}: training samples from softmax(logits / temperature), so it must be a "
                "positive number (greedy decoding, temperature 0, gives no exploration and no valid ratios). Use e.g. 1.0."
            )
        if not self.eval_temperature >= 0 or not math.isfinite(self.eval_temperature):
            raise ValueError(f"eval_temperature must be >= 0 (0: greedy evaluation), got {self.eval_temperature}")
        if not self.critic_learning_rate > 0:
            raise ValueError(f"critic_learning_rate must be positive, got {self.critic_learning_rate}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"value_clip must be positive (or None for no clipping), got {self.value_clip}")
        if not self.format_penalty <= 0:
            raise ValueError(
                f"format_penalty is added to the turn's reward: give it <= 0 (e.g. -0.1), got {self.format_penalty}"
            )
        if self.env_step_timeout is not None and not (
            self.env_step_timeout > 0 and math.isfinite(self.env_step_timeout)
        ):
            raise ValueError(
                f"env_step_timeout must be a finite number of seconds > 0, or None for no limit, got {self.env_step_timeout}"
            )
        for name in ("num_eval_episodes", "eval_rollout_batch_size", "num_train_seeds", "max_empty_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.critic_warmup_steps < 0:
            raise ValueError(f"critic_warmup_steps must be >= 0, got {self.critic_warmup_steps}")
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

    def rollout_settings(self) -> dict:
        """The settings in ``ROLLOUT_SETTINGS``, as saved next to a trained model."""
        return {name: getattr(self, name) for name in ROLLOUT_SETTINGS}


_AT_LEAST_0, _AT_LEAST_1, _POSITIVE, _UNIT, _ANY = Range(0), Range(1), Range(0, low_open=True), Range(0, 1), Range()
# The range of every numeric field declared in StarPOConfig (its own and the GRPOConfig defaults it changes); a
# field missing here fails at import (check_declared below), so no number escapes the one rule of numeric_settings.
NUMBER_RANGES = {
    **dict.fromkeys(
        (
            "num_start_states",
            "num_train_seeds",
            "num_eval_episodes",
            "eval_rollout_batch_size",
            *EPISODE_BUDGETS,
            "rollout_filter_empty_stop_steps",
            "rollout_filter_max_rounds",
            "rollout_filter_refill_groups",
            "max_empty_steps",
            "critic_epochs",
            "collapse_guard_warmup_steps",
            "collapse_guard_retrieval_warmup",
            "collapse_guard_patience",
            "collapse_guard_snapshot_steps",
            "mi_metrics_inputs",
            "mi_metrics_per_input",
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
            "eval_temperature",
            "rollout_filter_eps",
            "critic_warmup_steps",
            "collapse_guard_grad_norm_spike",
            "mi_metrics_every",
            "think_bonus",
            "think_min_words",
            "think_max_words",
            "think_copy_penalty",
            "epsilon_high",
            "beta",
            "entropy_coef",
            "learning_rate",
            "weight_decay",
        ),
        _AT_LEAST_0,
    ),
    **dict.fromkeys(("env_step_timeout", "rollout_filter_ratio", "critic_learning_rate", "value_clip"), _POSITIVE),
    **dict.fromkeys(("logging_steps",), _POSITIVE),
    **dict.fromkeys(
        (
            "gamma",
            "lam",
            "turn_gamma",
            "turn_lambda",
            "collapse_guard_reward_std_fraction",
            "collapse_guard_entropy_fraction",
            "collapse_guard_diversity_fraction",
            "collapse_guard_diversity_floor",
            "collapse_guard_retrieval_fraction",
        ),
        _UNIT,
    ),
    "collapse_guard_smoothing": Range(0, 1, low_open=True),
    "step_advantage_weight": _AT_LEAST_0,
    "overlong_buffer": _AT_LEAST_0,
    "overlong_penalty_factor": _AT_LEAST_0,
    "format_penalty": Range(None, 0),
    "env_failure_reward": _ANY,
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
            "help": "The expert writes '<answer> X</answer>': with BPE tokenizers ' X' is usually the one token the prompt shows X as (e.g. SmolLM2's ' Crane'; 'Crane' is 'Cr' + 'ane')."
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
    """The episode engine's settings from a ``StarPOConfig`` (or any object with its fields): every
    ``RolloutConfig`` field is read from the config field of the same name, and each ``ThinkShaping``
    field ``x`` from ``think_x``."""
    shaping = ThinkShaping(**{f.name: getattr(args, f"think_{f.name}") for f in fields(ThinkShaping)})
    return RolloutConfig(
        **{f.name: getattr(args, f.name) for f in fields(RolloutConfig) if f.name != "think_shaping"},
        think_shaping=shaping,
    )
