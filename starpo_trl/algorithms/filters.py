"""The StarPO-S rollout filter: which groups (start states) a step trains on."""

from __future__ import annotations

import math

import torch

from starpo_trl.algorithms.stats import group_std


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
    std = torch.nan_to_num(std, nan=float("inf") if metric == "std_rev" else -1.0)  # groups of failed envs go last
    # stable sort so equal stds keep the earlier group
    order = torch.sort(std if metric == "std_rev" else -std, stable=True).indices
    return torch.sort(order[:k]).values


def expand_groups(group_indices: torch.Tensor, group_size: int) -> torch.Tensor:
    """Trajectory indices of the given groups. (K,) -> (K * group_size,)."""
    return (group_indices[:, None] * group_size + torch.arange(group_size)[None, :]).reshape(-1)
