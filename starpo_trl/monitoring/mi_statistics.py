"""The mutual-information statistics of a sample of (input, reasoning) pairs, as pure functions.

``cross[i, j] = log p(z_i | x_j)``: reasoning ``z_i`` scored under input ``x_j`` (``mutual_info.cross_logprobs``
makes the matrix with the model); ``own[i]`` is the index of reasoning ``i``'s own input. What each quantity
means: ``starpo_trl.monitoring.mutual_info``'s docstring.
"""

from __future__ import annotations

import math

import torch


def mi_statistics(cross: torch.Tensor, own: torch.Tensor) -> dict[str, float]:
    """The MI quantities from ``cross`` (Nz, Nx): ``cross[i, j] = log p(z_i | x_j)``, and ``own`` (Nz,):
    the index of each reasoning's own input."""
    cross = cross.double()
    nz, nx = cross.shape
    rows = torch.arange(nz)
    matched = cross[rows, own]
    marginal = torch.logsumexp(cross, dim=1) - math.log(nx)
    out = {
        "conditional_entropy": -matched.mean().item(),
        "reasoning_entropy": -marginal.mean().item(),
        "mi_estimate": (matched - marginal).mean().item(),
        "mi_upper_bound": math.log(nx),
        "retrieval_accuracy": (cross.argmax(dim=1) == own).double().mean().item(),
        "retrieval_chance": 1.0 / nx,
    }
    if nx > 2:  # the other inputs' scores need a spread
        others = cross.masked_fill(torch.nn.functional.one_hot(own, nx).bool(), float("nan"))
        mean = others.nanmean(dim=1)
        std = ((others - mean[:, None]) ** 2).nanmean(dim=1).mul(nx - 1).div(nx - 2).sqrt()
        z = (matched - mean) / std
        out["mi_zscore"] = z[torch.isfinite(z)].mean().item() if torch.isfinite(z).any() else float("nan")
    return out


def mi_sample_statistics(cross: torch.Tensor, own: torch.Tensor, lengths: list[int]) -> dict[str, float]:
    """``mi_statistics`` per reasoning and ``*_per_token`` (each row of ``cross`` (Nz, Nx) divided by its
    reasoning's length in tokens, ``lengths`` (Nz,)), with the sample's size."""
    out = mi_statistics(cross, own)
    per_token = mi_statistics(cross / torch.tensor(lengths, dtype=torch.float64)[:, None], own)
    out.update({f"{k}_per_token": v for k, v in per_token.items() if k not in ("mi_upper_bound", "retrieval_chance")})
    out["num_inputs"], out["num_reasonings"] = float(cross.shape[1]), float(cross.shape[0])
    return out


def mi_forward_passes(num_inputs: int, num_reasonings: int, batch_size: int, shared_prefix: bool) -> int:
    """The forward passes ``cross_logprobs`` makes for a sample: one per input plus one per ``batch_size``
    reasonings under it (``shared_prefix``), or one per ``batch_size`` (input, reasoning) concatenations."""
    if not num_inputs or not num_reasonings:
        return 0
    if shared_prefix:
        return num_inputs * (1 + -(-num_reasonings // batch_size))
    return -(-num_inputs * num_reasonings // batch_size)


class EMANormalizer:
    """``(x - EMA mean) / EMA std`` of a series (the MI estimate over steps); NaN until two values are seen."""

    def __init__(self, weight: float = 0.1):
        self.weight, self.mean, self.var, self.count = weight, 0.0, 0.0, 0

    def __call__(self, x: float) -> float:
        z = (x - self.mean) / math.sqrt(self.var) if self.count >= 2 and self.var > 0 else float("nan")
        if self.count == 0:
            self.mean = x
        else:
            delta = x - self.mean
            self.mean += self.weight * delta
            self.var = (1 - self.weight) * (self.var + self.weight * delta * delta)
        self.count += 1
        return z
