"""One rollout's rewards -> the kept groups and their advantages: the StarPO-S step between playing
and the loss, as a pure function."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from starpo_trl.algorithms.advantages import (
    normalize_rewards,
    reward_normalization_terms,
)
from starpo_trl.algorithms.estimators import get_estimator
from starpo_trl.algorithms.filters import expand_groups, select_groups


@dataclass
class Scored:
    rewards: torch.Tensor  # (N,) episode rewards as used: NaN for an excluded failed episode
    kept_groups: torch.Tensor  # (K,) indices of the groups the filter kept
    keep: torch.Tensor  # (K * G,) indices of the kept episodes
    kept_rewards: torch.Tensor  # (K * G,) their normalised rewards
    advantages: torch.Tensor | None  # (K * G,) from a group estimator; None when a critic gives them per token


def score_rollout(
    episode_rewards: list[float], failed: torch.Tensor, group_size: int, args, scale_rewards: str = "group"
) -> Scored:
    """Failed episodes are left out (NaN: out of their group's statistics, advantage 0) or given
    ``env_failure_reward`` (``env_error_policy``); the variance filter ranks the groups on the RAW
    rewards of the whole batch; the kept rewards are normalised; a group estimator then gives each
    kept episode its advantage. ``args`` is the ``StarPOConfig``."""
    rewards = torch.tensor(episode_rewards, dtype=torch.float32)
    rewards[failed] = float("nan") if args.env_error_policy == "exclude" else args.env_failure_reward
    kept_groups = select_groups(rewards, group_size, args.rollout_filter_ratio, args.rollout_filter_metric)
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
