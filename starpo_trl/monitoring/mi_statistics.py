"""The mutual-information statistics of a sample of (input, reasoning) pairs, as pure functions.

``cross[i, j] = log p(z_i | x_j)``: reasoning ``z_i`` scored under input ``x_j`` (``mutual_info.cross_logprobs``
makes the matrix with the model); ``own[i]`` is the index of reasoning ``i``'s own input. What each quantity
means: ``starpo_trl.monitoring.mutual_info``'s docstring.
"""

from __future__ import annotations

import math

import torch

# RAGEN's constant in the denominators of its z-scores (ragen/trainer/collapse_metrics.py, std_eps)
RAGEN_STD_EPS = 1e-3


def mi_statistics(cross: torch.Tensor, own: torch.Tensor) -> dict[str, float]:
    """The MI quantities from ``cross`` (Nz, Nx): ``cross[i, j] = log p(z_i | x_j)``, and ``own`` (Nz,):
    the index of each reasoning's own input. ``mi_zscore`` is RAGEN's statistic on these scores:
    ``mean_i (matched_i - marginal_i) / (std(marginal) + 1e-3)``, the population std over the reasonings
    (``marginal_std``); ``own_input_zscore`` (N > 2): per reasoning, how many standard deviations its own
    input's score lies above the other inputs' scores, averaged."""
    cross = cross.double()
    nz, nx = cross.shape
    rows = torch.arange(nz)
    matched = cross[rows, own]
    marginal = torch.logsumexp(cross, dim=1) - math.log(nx)
    marginal_std = marginal.std(unbiased=False).item() if nz > 1 else 0.0
    out = {
        "conditional_entropy": -matched.mean().item(),
        "reasoning_entropy": -marginal.mean().item(),
        "mi_estimate": (matched - marginal).mean().item(),
        "mi_upper_bound": math.log(nx),
        "retrieval_accuracy": (cross.argmax(dim=1) == own).double().mean().item(),
        "retrieval_chance": 1.0 / nx,
        "marginal_std": marginal_std,
        "mi_zscore": ((matched - marginal) / (marginal_std + RAGEN_STD_EPS)).mean().item(),
    }
    if nx > 2:  # the other inputs' scores need a spread
        others = cross.masked_fill(torch.nn.functional.one_hot(own, nx).bool(), float("nan"))
        mean = others.nanmean(dim=1)
        std = ((others - mean[:, None]) ** 2).nanmean(dim=1).mul(nx - 1).div(nx - 2).sqrt()
        z = (matched - mean) / std
        out["own_input_zscore"] = z[torch.isfinite(z)].mean().item() if torch.isfinite(z).any() else float("nan")
    return out


# per reasoning (sums over its tokens) / per token (each row divided by its length) -> the logged key. RAGEN's
# names: its scores are per-token means, so its mi_zscore and marginal_std are per token and *_seq per reasoning.
# A row scaled by a positive length changes neither the argmax nor the own-input z-score: those are logged once.
SEQUENCE_KEYS = {
    "conditional_entropy": "conditional_entropy",
    "reasoning_entropy": "reasoning_entropy",
    "mi_estimate": "mi_estimate",
    "mi_upper_bound": "mi_upper_bound",
    "retrieval_accuracy": "retrieval_accuracy",
    "retrieval_chance": "retrieval_chance",
    "own_input_zscore": "own_input_zscore",
    "mi_zscore": "mi_zscore_seq",
    "marginal_std": "marginal_std_seq",
}
TOKEN_KEYS = {
    "conditional_entropy": "conditional_entropy_per_token",
    "reasoning_entropy": "reasoning_entropy_per_token",
    "mi_estimate": "mi_estimate_per_token",
    "mi_zscore": "mi_zscore",
    "marginal_std": "marginal_std",
}


def mi_sample_statistics(cross: torch.Tensor, own: torch.Tensor, lengths: list[int]) -> dict[str, float]:
    """``mi_statistics`` per reasoning and per token (each row of ``cross`` (Nz, Nx) divided by its reasoning's
    length in tokens, ``lengths`` (Nz,)) under the keys of ``SEQUENCE_KEYS`` / ``TOKEN_KEYS``, with the sample's size."""
    sequence = mi_statistics(cross, own)
    token = mi_statistics(cross / torch.tensor(lengths, dtype=torch.float64)[:, None], own)
    out = {key: sequence[name] for name, key in SEQUENCE_KEYS.items() if name in sequence}
    out.update({key: token[name] for name, key in TOKEN_KEYS.items()})
    out["num_inputs"], out["num_reasonings"] = float(cross.shape[1]), float(cross.shape[0])
    return out


def ragen_zscore_ema(mi_estimate: float, marginal_std_ema: float) -> float:
    """RAGEN's ``mi_zscore_ema``: ``mean_i (matched_i - marginal_i) / (EMA of marginal_std + 1e-3)``, which is
    the MI estimate over that denominator (the same scores: per token, or per reasoning for ``_seq``)."""
    return mi_estimate / (marginal_std_ema + RAGEN_STD_EPS)


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
