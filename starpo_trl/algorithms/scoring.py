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


@dataclass
class Scored:
    rewards: torch.Tensor  # (N,) episode rewards as used: NaN for an excluded failed episode
    kept_groups: torch.Tensor  # (K,) indices of the groups the filter kept
    keep: torch.Tensor  # (K * G,) indices of the kept episodes
    kept_rewards: torch.Tensor  # (K * G,) their normalised rewards
    advantages: torch.Tensor | None  # (K * G,) from a group estimator; None when a critic gives them per token


def filter_groups(
    rewards: torch.Tensor,
    group_size: int,
    args,
    entropies: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    num_processes: int = 1,
    group_env: list[int] | None = None,
) -> torch.Tensor:
    """The groups the rollout filter keeps (sorted indices; may be empty), by the ``rollout_filter_*``
    settings of ``args``. ``group_env`` (one env index per group) with ``rollout_filter_scope="per_env"``
    applies the strategy within each env's groups (a quota per env). Under several processes the
    lowest-scored kept groups are dropped until the kept rows divide evenly among them."""
    num_groups = rewards.numel() // group_size
    metric, largest = args.rollout_filter_metric, args.rollout_filter_type == "largest"
    if metric == "none":
        return torch.arange(num_groups)
    if metric == "std_rev":
        metric, largest = "std", False
    scores = group_scores(rewards, group_size, metric, entropies, lengths)

    def select(subset: torch.Tensor) -> torch.Tensor:
        kept = select_groups(
            scores[subset],
            args.rollout_filter_strategy,
            args.rollout_filter_ratio,
            args.rollout_filter_include_zero,
            largest,
            args.rollout_filter_top_p_mode,
            args.rollout_filter_eps,
        )
        return subset[kept]

    envs = torch.tensor(group_env if group_env is not None else [0] * num_groups)
    if args.rollout_filter_scope == "per_env" and len(envs.unique()) > 1:
        kept = torch.cat([select(torch.nonzero(envs == e).flatten()) for e in envs.unique()])
        key = torch.nan_to_num(scores[kept] if largest else -scores[kept], nan=-math.inf)
        kept = kept[torch.sort(-key, stable=True).indices]  # best first over the envs, for the trimming below
    else:
        kept = select(torch.arange(num_groups))
    while len(kept) * group_size % num_processes:
        kept = kept[:-1]
    return torch.sort(kept).values


def score_rollout(
    episode_rewards: list[float],
    failed: torch.Tensor,
    group_size: int,
    args,
    scale_rewards: str = "group",
    entropies: list[float] | None = None,
    lengths: list[int] | None = None,
    num_processes: int = 1,
    group_env: list[int] | None = None,
) -> Scored:
    """Failed episodes are left out (NaN: out of their group's statistics, advantage 0) or given
    ``env_failure_reward`` (``env_error_policy``); the rollout filter ranks the groups on the RAW
    rewards of the whole batch (``filter_groups``); the kept rewards are normalised; a group
    estimator then gives each kept episode its advantage. ``args`` is the ``StarPOConfig``;
    ``entropies`` / ``lengths`` per episode feed those filter metrics."""
    rewards = torch.tensor(episode_rewards, dtype=torch.float32)
    rewards[failed] = float("nan") if args.env_error_policy == "exclude" else args.env_failure_reward
    kept_groups = filter_groups(
        rewards,
        group_size,
        args,
        None if entropies is None else torch.tensor(entropies, dtype=torch.float32),
        None if lengths is None else torch.tensor(lengths, dtype=torch.float32),
        num_processes,
        group_env,
    )
    keep = expand_groups(kept_groups, group_size)
    kept_rewards = normalize_rewards(rewards[keep], group_size, args.reward_normalization, args.reward_norm_scope)
    estimator = get_estimator(args.advantage_estimator)
    advantages = None if estimator.critic else estimator.fn(kept_rewards, group_size, scale_rewards)
    return Scored(rewards, kept_groups, keep, kept_rewards, advantages)


def critic_turn_rewards(
    turn_rewards: list[list[float]], raw: torch.Tensor, normalized: torch.Tensor, rows: slice, group_size: int, args
) -> list[list[float]]:
    """What a critic estimator trains on, per turn, for the kept episodes ``rows`` of the kept batch.

    With ``use_turn_rewards`` each turn's own reward divided by the normalisation scale, the shift
    taken off the last turn, so the turns add up to the normalised episode reward (asym_clip is
    refused then); otherwise the whole normalised episode reward on the last turn. ``raw`` and
    ``normalized`` are the whole kept batch's episode rewards (group statistics need all of it).
    """
    if args.use_turn_rewards:
        shift, scale = reward_normalization_terms(raw, group_size, args.reward_normalization, args.reward_norm_scope)
        return [
            [x / c for x in turns[:-1]] + [(turns[-1] - m) / c] if turns else []
            for turns, m, c in zip(turn_rewards, shift[rows].tolist(), scale[rows].tolist())
        ]
    return [
        [0.0] * (len(turns) - 1) + [n] if turns else [] for turns, n in zip(turn_rewards, normalized[rows].tolist())
    ]


def add_function_rewards(episodes, reward_funcs) -> dict[str, float]:
    """Add TRL-style reward functions' rewards to each episode's last turn (episodes that failed or
    never acted are left as they are). ``f(prompts, completions, env_id, seed, success, env_reward)``:
    each episode's first message, the rest of its conversation (message dicts) and its env's id, seed,
    success and reward; it returns one reward per episode (None counts 0). Returns each function's
    mean reward, by its name."""
    scored = [ep for ep in episodes if ep.turn_rewards and ep.env_error is None]
    means: dict[str, float] = {}
    if not scored:
        return means
    prompts = [ep.messages[:1] for ep in scored]
    completions = [ep.messages[1:] for ep in scored]
    extra = {
        "env_id": [ep.start.env_id for ep in scored],
        "seed": [ep.start.seed for ep in scored],
        "success": [ep.success for ep in scored],
        "env_reward": [ep.reward for ep in scored],
    }
    for fn in reward_funcs:
        values = [0.0 if v is None else float(v) for v in fn(prompts=prompts, completions=completions, **extra)]
        if len(values) != len(scored):
            raise ValueError(
                f"reward function {fn.__name__} returned {len(values)} rewards for {len(scored)} episodes"
            )
        for ep, value in zip(scored, values):
            ep.turn_rewards[-1] += value
        means[fn.__name__] = sum(values) / len(values)
    return means


def env_reward(completions, episode_reward, **kwargs) -> list[float]:
    """TRL reward function for episodes: the env's total reward (plus format penalties) of each one.

    GRPOTrainer requires a reward source; for episodes it is the env, and the trainer fills
    ``episode_reward`` itself, so this function only reads it back.
    """
    return [float(r) for r in episode_reward]
