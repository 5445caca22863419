"""StarPO algorithms as pure tensor functions: group statistics, the variance filter, GRPO advantages.

Rewards arrive as a flat tensor of ``num_groups * group_size`` trajectory rewards, grouped
consecutively (trajectories ``[g * G, (g + 1) * G)`` share start state ``g``).
"""

from __future__ import annotations

import math

import torch


def group_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """In-group standard deviation (unbiased, as in GRPO) of trajectory rewards. (N,) -> (N / G,)."""
    return rewards.view(-1, group_size).std(dim=1, unbiased=True)


def num_kept_groups(num_groups: int, ratio: float) -> int:
    """How many groups a keep-ratio keeps: ``ceil(ratio * num_groups)`` (at least one for ratio > 0)."""
    return min(num_groups, max(1, math.ceil(ratio * num_groups - 1e-9)))


def select_groups(rewards: torch.Tensor, group_size: int, ratio: float, metric: str = "std") -> torch.Tensor:
    """Indices (sorted) of the groups the StarPO-S variance filter keeps.

    ``metric="std"`` keeps the ``ratio`` share of groups with the LARGEST in-group reward std (most
    uncertain start states), ``"std_rev"`` the smallest, ``"none"`` keeps every group. Ranking uses
    the raw trajectory rewards: normalise only after selection. Ties keep the earlier group.

    rewards: (num_groups * group_size,) -> (num_kept,) long tensor of group indices.
    """
    num_groups = rewards.numel() // group_size
    if metric == "none" or ratio >= 1.0:
        return torch.arange(num_groups)
    if metric not in ("std", "std_rev"):
        raise ValueError(f"rollout_filter_metric must be 'std', 'std_rev' or 'none', got {metric!r}")
    k = num_kept_groups(num_groups, ratio)
    std = group_std(rewards.float(), group_size)
    # stable sort so equal stds keep the earlier group
    order = torch.sort(std if metric == "std_rev" else -std, stable=True).indices
    return torch.sort(order[:k]).values


def expand_groups(group_indices: torch.Tensor, group_size: int) -> torch.Tensor:
    """Trajectory indices of the given groups. (K,) -> (K * group_size,)."""
    return (group_indices[:, None] * group_size + torch.arange(group_size)[None, :]).reshape(-1)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages: reward minus its group mean, divided by the group std (``scale="group"``), the
    batch std (``"batch"``) or nothing (``"none"``). Same formula and ``eps`` as TRL. (N,) -> (N,)."""
    grouped = rewards.view(-1, group_size)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale == "none":
        return centred
    if scale == "group":
        std = grouped.std(dim=1, unbiased=True).repeat_interleave(group_size)
    elif scale == "batch":
        std = rewards.std(unbiased=True).expand_as(rewards)
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale!r}")
    return centred / (std + eps)
