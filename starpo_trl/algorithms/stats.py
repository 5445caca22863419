"""Group statistics as pure tensor functions.

Rewards arrive as a flat tensor of ``num_groups * group_size`` trajectory rewards, grouped
consecutively (trajectories ``[g * G, (g + 1) * G)`` share start state ``g``). A NaN reward marks
a trajectory left out (its env failed): statistics ignore it.
"""

from __future__ import annotations

import math

import torch


def nanstd(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """Unbiased std ignoring NaNs (NaN where fewer than two values)."""
    valid = ~torch.isnan(x)
    n = valid.sum(dim=dim, keepdim=True)
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.where(valid, (x - mean) ** 2, torch.zeros_like(x)).sum(dim=dim, keepdim=True) / (n - 1)
    var = torch.where(n > 1, var, torch.full_like(var, float("nan")))
    return var.sqrt() if keepdim else var.sqrt().squeeze(dim)


def group_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """In-group standard deviation (unbiased, as in GRPO) of trajectory rewards. (N,) -> (N / G,)."""
    return nanstd(rewards.view(-1, group_size), dim=1)


def between_group_share(rewards: torch.Tensor, group_size: int) -> float:
    """Estimated share of the reward variance that lies between start states (groups), in [0, 1].

    The one-way random-effects (ANOVA) estimate: ``s_b = max(0, (MSB - MSW) / G)``, ``s_w = MSW``,
    share ``s_b / (s_b + s_w)``, which corrects the spread of group means for their sampling noise.
    A critic that knows the start state, and nothing after it, explains about this share of the
    return variance (gamma = lambda = 1, trajectory reward); an ideal one at least that. Groups with
    a failed episode (NaN) are left out; NaN when fewer than two groups remain or all rewards are equal.
    """
    r = rewards.view(-1, group_size).double()
    r = r[~torch.isnan(r).any(dim=1)]
    k = len(r)
    if k < 2:
        return float("nan")
    means = r.mean(dim=1)
    msb = group_size * ((means - means.mean()) ** 2).sum() / (k - 1)
    msw = ((r - means[:, None]) ** 2).sum() / (k * (group_size - 1))
    between = torch.clamp((msb - msw) / group_size, min=0.0)
    total = between + msw
    return float("nan") if total == 0 else float(between / total)


def constant_groups(view: torch.Tensor) -> torch.Tensor:
    """Rows (groups) of ``view`` (K, G) whose non-NaN values are all equal, as a (K, 1) bool tensor.

    Such a group carries no signal: centring it must give exact zeros, not float rounding noise
    (16 copies of 2.4146361351013184 have a float32 mean that differs from the value in its last bit).
    """
    low = torch.where(torch.isnan(view), torch.full_like(view, math.inf), view).amin(dim=1, keepdim=True)
    high = torch.where(torch.isnan(view), torch.full_like(view, -math.inf), view).amax(dim=1, keepdim=True)
    return (low == high) | (low == math.inf)


def centred(view: torch.Tensor) -> torch.Tensor:
    """Each row of ``view`` (K, G) minus its NaN-ignoring mean; exactly 0 in a constant row."""
    mean = torch.nanmean(view, dim=1, keepdim=True)
    return torch.where(constant_groups(view), torch.zeros_like(view), view - mean)


def whiten(
    values: torch.Tensor, mask: torch.Tensor, total: tuple[float, float, float] | None = None, eps: float = 1e-8
) -> torch.Tensor:
    """Masked whitening, as the peers apply to GAE advantages: ``(x - mean) / sqrt(var + eps)`` over the
    positions where ``mask`` is 1 (model tokens); 0 elsewhere. The variance is unbiased (``n - 1``).

    ``total``: ``(count, sum, sum of squares)`` over every process's rows, when the batch is split
    across processes (the statistics then match one process holding the whole batch). (B, T) -> (B, T).
    """
    m = mask.bool()
    x = values.double()
    n, s, ss = total if total is not None else (float(m.sum()), float(x[m].sum()), float((x[m] ** 2).sum()))
    if n < 2:
        return torch.zeros_like(values)
    mean = s / n
    var = max(ss - n * mean * mean, 0.0) / (n - 1)
    out = (x - mean) / math.sqrt(var + eps)
    return torch.where(m, out, torch.zeros_like(out)).to(values.dtype)
