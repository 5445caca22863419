"""The StarPO-S rollout filter: which groups (start states) a step trains on.

Two pure steps. ``group_scores`` gives each group a score: its in-group reward ``std`` (the paper's
StarPO-S), ``reward_variance`` (RAGEN's current default under RAGEN's name, computed as RAGEN's code does:
the in-group **std**, the same as ``std``), ``variance`` (the std squared), its ``mean`` reward, its mean per-token
``entropy`` (estimated from the sampling logprobs: the mean of ``-log p`` over the sampled model
tokens, an unbiased estimate of the policy's entropy along the episode; no extra forward pass) or
its mean ``length`` (model tokens per episode). ``select_groups`` then keeps groups by a strategy:

- ``top_k``: the ``ceil(value * num_groups)`` best groups (at least one), the paper's rule;
- ``top_k_abs``: the ``int(value)`` best groups;
- ``top_p`` ``linear``: groups sorted best first, kept until their cumulative score reaches
  ``value * sum(scores) - eps``; when that threshold is not positive (every score is about zero)
  nothing is kept and the step is skipped (``rollout/empty_after_filter``);
- ``top_p`` ``softmax``: the smallest best-first set whose ``softmax(scores)`` mass reaches ``value``;
- ``min_p``: groups scoring at least ``value`` times the best score (``smallest``: at most the
  lowest score divided by ``value``).

``largest`` (default) ranks high scores first, ``smallest`` low ones. With ``include_zero=False`` a
zero-score group (for ``std`` / ``reward_variance`` / ``variance``: every episode earned the same reward) is never kept;
``top_p >= 1`` keeps every candidate. Ties keep the earlier group. A group whose every episode
failed (NaN score) is dropped by ``top_p`` / ``min_p`` and ranked last by ``top_k`` /
``top_k_abs`` (which keep a fixed count). ``top_p`` ``linear`` and ``min_p`` need non-negative scores.
"""

from __future__ import annotations

import math

import torch

from starpo_trl.algorithms.stats import constant_groups, group_std

GROUP_METRICS = ("std", "reward_variance", "variance", "mean", "entropy", "length")
STRATEGIES = ("top_k", "top_k_abs", "top_p", "min_p")
TOP_P_MODES = ("linear", "softmax")


def num_kept_groups(num_groups: int, ratio: float) -> int:
    """How many groups a keep-ratio keeps: ``ceil(ratio * num_groups)`` (at least one for ratio > 0)."""
    return min(num_groups, max(1, math.ceil(ratio * num_groups - 1e-9)))


def group_scores(
    rewards: torch.Tensor,
    group_size: int,
    metric: str = "std",
    entropies: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each group's score. ``rewards`` (N,) raw episode rewards, NaN for a failed episode (left out of
    every statistic); ``entropies`` / ``lengths`` (N,) per episode, needed by those metrics. -> (N / G,)."""
    view = rewards.float().view(-1, group_size)
    if metric in ("std", "reward_variance", "variance"):
        std = group_std(rewards.float(), group_size)
        constant = constant_groups(view).squeeze(1) & ~torch.isnan(view).all(dim=1)
        std = torch.where(constant, torch.zeros_like(std), std)  # exactly zero, not rounding noise
        # RAGEN's reward_variance ranks by the in-group std (RolloutFilter: rm_scores.std(dim=-1)), despite its name
        return std * std if metric == "variance" else std
    if metric == "mean":
        return torch.nanmean(view, dim=1)
    if metric in ("entropy", "length"):
        values = entropies if metric == "entropy" else lengths
        if values is None:
            raise ValueError(f"group metric {metric!r} needs the episodes' {metric} values")
        values = values.float().view(-1, group_size).clone()
        values[torch.isnan(view)] = float("nan")  # failed episodes are left out here too
        return torch.nanmean(values, dim=1)
    raise ValueError(f"rollout_filter_metric must be one of {GROUP_METRICS}, got {metric!r}")


def select_groups(
    scores: torch.Tensor,
    strategy: str = "top_k",
    value: float = 0.25,
    include_zero: bool = True,
    largest: bool = True,
    top_p_mode: str = "linear",
    eps: float = 0.01,
) -> torch.Tensor:
    """Indices of the groups ``strategy`` keeps, best first (may be empty). scores: (num_groups,)."""
    num_groups = scores.numel()
    scores = scores.double()
    valid = ~torch.isnan(scores)
    candidates = valid & (scores != 0) if not include_zero else valid
    key = scores if largest else -scores
    # best first; ties keep the earlier group; NaN last
    order = torch.sort(torch.nan_to_num(-key, nan=math.inf), stable=True).indices
    if strategy in ("top_k", "top_k_abs"):
        k = num_kept_groups(num_groups, value) if strategy == "top_k" else min(num_groups, int(value))
        return order[candidates[order] | ~valid[order]][:k]  # failed groups (NaN) fill the count, last
    ranked = order[candidates[order]]
    if len(ranked) == 0:
        return ranked
    s = scores[ranked]
    if strategy == "top_p":
        if value >= 1.0:
            return ranked
        if top_p_mode == "softmax":
            mass = torch.cumsum(torch.softmax(s if largest else -s, dim=0), dim=0)
            return ranked[: int((mass < value - 1e-12).sum()) + 1]
        if top_p_mode != "linear":
            raise ValueError(f"rollout_filter_top_p_mode must be one of {TOP_P_MODES}, got {top_p_mode!r}")
        _non_negative(s, "top_p linear")
        if not largest:
            raise ValueError("top_p linear keeps a share of the score mass from the top: use largest, or softmax mode")
        threshold = value * float(s.sum()) - eps
        if threshold <= 0:
            return ranked[:0]
        return ranked[: int((torch.cumsum(s, dim=0) < threshold).sum()) + 1]
    if strategy == "min_p":
        _non_negative(s, "min_p")
        keep = s >= value * s.max() if largest else s <= s.min() / value
        return ranked[keep]
    raise ValueError(f"rollout_filter_strategy must be one of {STRATEGIES}, got {strategy!r}")


def _non_negative(scores: torch.Tensor, what: str) -> None:
    if (scores < 0).any():
        raise ValueError(
            f"{what} compares shares of the scores, which must be non-negative (got {scores.min().item():.4g}): "
            "use a metric that is (std, reward_variance, variance, entropy, length) or the top_k / softmax top_p strategies."
        )


def expand_groups(group_indices: torch.Tensor, group_size: int) -> torch.Tensor:
    """Trajectory indices of the given groups. (K,) -> (K * group_size,)."""
    return (group_indices[:, None] * group_size + torch.arange(group_size)[None, :]).reshape(-1)


def best_groups(scores: torch.Tensor, candidates: torch.Tensor, count: int, largest: bool = True) -> torch.Tensor:
    """The ``count`` best of the groups ``candidates`` (indices into ``scores``), best first: ties keep the
    earlier group, a NaN score (every episode failed) comes last."""
    candidates = torch.sort(candidates).values
    key = scores[candidates].double()
    key = key if largest else -key
    order = torch.sort(torch.nan_to_num(-key, nan=math.inf), stable=True).indices
    return candidates[order][:count]
