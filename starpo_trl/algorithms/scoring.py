"""One rollout's rewards -> the kept groups and their advantages: the StarPO-S step between playing
and the loss, as a pure function."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from starpo_trl.algorithms.advantages import (
    normalize_rewards,
    reward_normalization_terms,
)
from starpo_trl.algorithms.estimators import get_estimator
from starpo_trl.algorithms.filters import expand_groups, group_scores, select_groups
from starpo_trl.algorithms.settings import REWARD_FUNC_ERRORS, AdvantageSettings, FilterSettings, ScoringSettings


@dataclass
class Scored:
    rewards: torch.Tensor  # (N,) episode rewards as used: NaN for an excluded failed episode
    kept_groups: torch.Tensor  # (K,) indices of the groups the filter kept
    keep: torch.Tensor  # (K * G,) indices of the kept episodes
    kept_rewards: torch.Tensor  # (K * G,) their normalised rewards
    advantages: torch.Tensor | None  # (K * G,) from a group estimator; None when a critic gives them per token


def filter_scores(
    rewards: torch.Tensor,
    group_size: int,
    settings: FilterSettings,
    entropies: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, bool]:
    """Each group's score under ``settings.rollout_filter_metric`` (not ``none``), and whether the filter keeps
    the largest scores (``std_rev`` is ``std`` kept smallest first)."""
    metric, largest = settings.rollout_filter_metric, settings.rollout_filter_type == "largest"
    if metric == "std_rev":
        metric, largest = "std", False
    return group_scores(rewards, group_size, metric, entropies, lengths), largest


def filter_groups(
    rewards: torch.Tensor,
    group_size: int,
    settings: FilterSettings,
    entropies: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    num_processes: int = 1,
    group_env: list[int] | None = None,
) -> torch.Tensor:
    """The groups the rollout filter keeps (sorted indices; may be empty), by the ``rollout_filter_*``
    settings. ``group_env`` (one env index per group) with ``rollout_filter_scope="per_env"``
    applies the strategy within each env's groups (a quota per env). Under several processes the
    lowest-scored kept groups are dropped until the kept rows divide evenly among them."""
    num_groups = rewards.numel() // group_size
    if settings.rollout_filter_metric == "none":
        return torch.arange(num_groups)
    scores, largest = filter_scores(rewards, group_size, settings, entropies, lengths)

    def select(subset: torch.Tensor) -> torch.Tensor:
        kept = select_groups(
            scores[subset],
            settings.rollout_filter_strategy,
            settings.rollout_filter_ratio,
            settings.rollout_filter_include_zero,
            largest,
            settings.rollout_filter_top_p_mode,
            settings.rollout_filter_eps,
        )
        return subset[kept]

    envs = torch.tensor(group_env if group_env is not None else [0] * num_groups)
    if settings.rollout_filter_scope == "per_env" and len(envs.unique()) > 1:
        kept = torch.cat([select(torch.nonzero(envs == e).flatten()) for e in envs.unique()])
        key = torch.nan_to_num(scores[kept] if largest else -scores[kept], nan=-math.inf)
        kept = kept[torch.sort(-key, stable=True).indices]  # best first over the envs, for the trimming below
    else:
        kept = select(torch.arange(num_groups))
    while len(kept) * group_size % num_processes:
        kept = kept[:-1]
    return torch.sort(kept).values


def episode_reward_tensor(
    episode_rewards: list[float], failed: torch.Tensor, settings: AdvantageSettings
) -> torch.Tensor:
    """Episode rewards as the filter and the estimators use them: a failed episode's is NaN (left out,
    ``env_error_policy="exclude"``) or ``env_failure_reward``."""
    rewards = torch.tensor(episode_rewards, dtype=torch.float32)
    rewards[failed] = float("nan") if settings.env_error_policy == "exclude" else settings.env_failure_reward
    return rewards


def score_rollout(
    episode_rewards: list[float],
    failed: torch.Tensor,
    group_size: int,
    settings: ScoringSettings,
    scale_rewards: str = "group",
    entropies: list[float] | None = None,
    lengths: list[int] | None = None,
    num_processes: int = 1,
    group_env: list[int] | None = None,
    kept_groups: torch.Tensor | None = None,
) -> Scored:
    """Failed episodes are left out (NaN: out of their group's statistics, advantage 0) or given
    ``env_failure_reward`` (``env_error_policy``); the rollout filter ranks the groups on the RAW
    rewards of the whole batch (``filter_groups``); the kept rewards are normalised; a group
    estimator then gives each kept episode its advantage. ``settings``: the filter's and the advantages' (a ``StarPOConfig`` is both);
    ``entropies`` / ``lengths`` per episode feed those filter metrics. ``kept_groups`` given (the
    refill's choice over several rounds, ``starpo_trl.refill``) replaces the filter's."""
    rewards = episode_reward_tensor(episode_rewards, failed, settings)
    if kept_groups is None:
        kept_groups = filter_groups(
            rewards,
            group_size,
            settings,
            None if entropies is None else torch.tensor(entropies, dtype=torch.float32),
            None if lengths is None else torch.tensor(lengths, dtype=torch.float32),
            num_processes,
            group_env,
        )
    keep = expand_groups(kept_groups, group_size)
    kept_rewards = normalize_rewards(
        rewards[keep], group_size, settings.reward_normalization, settings.reward_norm_scope
    )
    estimator = get_estimator(settings.advantage_estimator)
    group = not estimator.critic and not estimator.per_turn
    advantages = estimator.fn(kept_rewards, group_size, scale_rewards) if group else None
    return Scored(rewards, kept_groups, keep, kept_rewards, advantages)


def critic_turn_rewards(
    turn_rewards: list[list[float]],
    raw: torch.Tensor,
    normalized: torch.Tensor,
    rows: slice,
    group_size: int,
    settings: AdvantageSettings,
) -> list[list[float]]:
    """What a critic estimator trains on, per turn, for the kept episodes ``rows`` of the kept batch.

    With ``use_turn_rewards`` each turn's own reward divided by the normalisation scale, the shift
    taken off the last turn, so the turns add up to the normalised episode reward (asym_clip is
    refused then); otherwise the whole normalised episode reward on the last turn. ``raw`` and
    ``normalized`` are the whole kept batch's episode rewards (group statistics need all of it).
    """
    if settings.use_turn_rewards:
        shift, scale = reward_normalization_terms(
            raw, group_size, settings.reward_normalization, settings.reward_norm_scope
        )
        return [
            [x / c for x in turns[:-1]] + [(turns[-1] - m) / c] if turns else []
            for turns, m, c in zip(turn_rewards, shift[rows].tolist(), scale[rows].tolist())
        ]
    return [
        [0.0] * (len(turns) - 1) + [n] if turns else [] for turns, n in zip(turn_rewards, normalized[rows].tolist())
    ]


class RewardFunctionError(ValueError):
    """A reward function raised or returned something other than one number per episode."""


def add_function_rewards(episodes, reward_funcs, on_error: str = "raise") -> dict[str, float]:
    """Add TRL-style reward functions' rewards to each episode's last turn (episodes that failed or
    never acted are left as they are). ``f(prompts, completions, env_id, seed, success, env_reward)``:
    each episode's first message, the rest of its conversation (message dicts) and its env's id, seed,
    success and reward; it returns one reward per episode (None counts 0). Returns each function's
    mean reward over the episodes it scored, by its name.

    As an env's rewards: a NaN or infinite reward ends that episode as an env error
    (``reward_func <name>: non-finite reward nan``, counted in ``env/errors``, then ``env_error_policy``).
    A function that raises (or returns something other than one number per episode) stops training
    with an error naming it (``on_error="raise"``), or with ``on_error="mark"`` ends every episode it
    was called on as an env error naming it."""
    if on_error not in REWARD_FUNC_ERRORS:
        raise ValueError(f"on_error must be one of {REWARD_FUNC_ERRORS}, got {on_error!r}")
    means: dict[str, float] = {}
    for fn in reward_funcs:
        name = getattr(fn, "__name__", type(fn).__name__)
        scored = [ep for ep in episodes if ep.turn_rewards and ep.env_error is None]
        if not scored:
            break
        try:
            values = _call_reward_func(fn, name, scored)
        except Exception as err:
            if on_error == "raise":
                raise RewardFunctionError(
                    f"reward function {name!r} failed on {len(scored)} episodes: {type(err).__name__}: {err}. Fix it, or "
                    "set reward_func_errors='mark' to end the episodes of such a call as env errors and train on."
                ) from err
            for ep in scored:
                ep.env_error, ep.done = f"reward_func {name}: {type(err).__name__}: {err}"[:500], True
            return means  # every episode still standing was in this call: none is left for the next function
        finite = []
        for ep, value in zip(scored, values):
            if math.isfinite(value):
                ep.turn_rewards[-1] += value
                finite.append(value)
            else:
                ep.env_error, ep.done = f"reward_func {name}: non-finite reward {value!r}", True
        if finite:
            means[name] = sum(finite) / len(finite)
    return means


def _call_reward_func(fn, name: str, scored) -> list[float]:
    """One reward per episode from ``fn`` (None counts 0), as floats; anything else raises."""
    kwargs = {
        "prompts": [ep.messages[:1] for ep in scored],
        "completions": [ep.messages[1:] for ep in scored],
        "env_id": [ep.start.env_id for ep in scored],
        "seed": [ep.start.seed for ep in scored],
        "success": [ep.success for ep in scored],
        "env_reward": [ep.reward for ep in scored],
    }
    values = [0.0 if v is None else float(v) for v in fn(**kwargs)]
    if len(values) != len(scored):
        raise ValueError(f"reward function {name} returned {len(values)} rewards for {len(scored)} episodes")
    return values


def env_reward(completions, episode_reward, **kwargs) -> list[float]:
    """TRL reward function for episodes: the env's total reward (plus format penalties) of each one.

    GRPOTrainer requires a reward source; for episodes it is the env, and the trainer fills
    ``episode_reward`` itself, so this function only reads it back.
    """
    return [float(r) for r in episode_reward]
