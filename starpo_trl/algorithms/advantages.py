"""Advantage estimators and reward shaping as pure tensor functions: GRPO / RLOO group advantages, the
batch-mean (REINFORCE++) baseline, reward normalisation, GAE over model tokens and the bi-level (turn,
token) GAE.

Rewards arrive as a flat tensor of ``num_groups * group_size`` trajectory rewards, grouped
consecutively (trajectories ``[g * G, (g + 1) * G)`` share start state ``g``). A NaN reward marks
a trajectory left out (its env failed): its advantage is 0.
"""

from __future__ import annotations

import math

import torch

from starpo_trl.algorithms.stats import centred, constant_groups, nanstd


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages: reward minus its group mean, divided by the group std (``scale="group"``), the
    batch std (``"batch"``) or nothing (``"none"``). Same formula and ``eps`` as TRL; a group whose
    rewards are all equal gets exactly 0. (N,) -> (N,)."""
    grouped = rewards.view(-1, group_size)
    diff = centred(grouped).reshape(-1)
    if scale == "none":
        return torch.nan_to_num(diff, nan=0.0)
    if scale == "group":
        std = nanstd(grouped, dim=1).repeat_interleave(group_size)
    elif scale == "batch":
        std = nanstd(rewards, dim=0).expand_as(rewards)
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale!r}")
    return torch.nan_to_num(diff / (torch.nan_to_num(std, nan=0.0) + eps), nan=0.0)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO: reward minus the mean of the OTHER trajectories of its group. (N,) -> (N,)."""
    grouped = rewards.view(-1, group_size)
    valid = ~torch.isnan(grouped)
    filled = torch.nan_to_num(grouped, nan=0.0)
    count = valid.sum(dim=1, keepdim=True) - valid.long()
    others = (filled.sum(dim=1, keepdim=True) - filled) / count.clamp(min=1)
    return torch.where(valid & (count > 0), grouped - others, torch.zeros_like(grouped)).reshape(-1)


def batch_mean_advantages(rewards: torch.Tensor, scale: str = "batch", eps: float = 1e-4) -> torch.Tensor:
    """REINFORCE++'s global baseline: reward minus the mean over the whole kept batch, divided by the
    batch std (``scale="batch"``) or nothing (``"none"``), one advantage per trajectory (REINFORCE++
    whitens per token, which weighs long replies more). Unlike GRPO, a group whose rewards all agree
    still gets a gradient when the rest of the batch differs: under mirrored start states, a pair
    answered the same way in both mirrors gives +a in one and -b in the other. A NaN reward (failed
    episode) is left out of the mean and std and gets 0. It is GRPO with the whole batch as one group.
    (N,) -> (N,)."""
    if scale not in ("batch", "none"):
        raise ValueError(
            f"the batch-mean baseline scales over the batch: scale_rewards must be 'batch' or 'none', got {scale!r}"
        )
    return grpo_advantages(rewards, max(rewards.numel(), 1), scale, eps)


def reward_normalization_terms(
    rewards: torch.Tensor, group_size: int, method: str = "identity", scope: str = "group"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(shift, scale)`` per trajectory such that the normalised reward is ``(r - shift) / scale``.

    ``identity``: (0, 1); ``mean``: (mean, 1); ``mean_std`` and ``asym_clip``: (mean, std + 1e-6),
    with mean and std per group (``scope="group"``, per start state) or over the batch. A group (or
    batch) whose rewards are all equal carries no signal: every method but ``identity`` gives it
    ``scale = inf``, so its normalised rewards, and each of its normalised turn rewards
    (``r_turn / scale``), are exactly 0 and it contributes no gradient.
    """
    if method not in ("identity", "mean", "mean_std", "asym_clip"):
        raise ValueError(f"reward_normalization must be identity, mean, mean_std or asym_clip, got {method!r}")
    if method == "identity":
        return torch.zeros_like(rewards), torch.ones_like(rewards)
    view = rewards.view(-1, group_size) if scope == "group" else rewards.view(1, -1)
    shift = torch.nan_to_num(torch.nanmean(view, dim=1, keepdim=True), nan=0.0).expand_as(view)
    scale = torch.ones_like(view)
    if method != "mean" and view.shape[1] > 1:
        scale = (torch.nan_to_num(nanstd(view, dim=1, keepdim=True), nan=0.0) + 1e-6).expand_as(view)
    scale = torch.where(constant_groups(view), torch.full_like(view, math.inf), scale)
    return shift.reshape(-1), scale.reshape(-1)


def normalize_rewards(
    rewards: torch.Tensor, group_size: int, method: str = "identity", scope: str = "group", clip: float = 1.0
) -> torch.Tensor:
    """Reward normalisation, applied AFTER the variance filter ranked the raw rewards. (N,) -> (N,).

    ``identity``; ``mean`` (subtract the mean); ``mean_std`` (subtract the mean, divide by std + 1e-6);
    ``asym_clip`` (``mean_std`` then clip to ``[-clip, 3 * clip]``, so rare large wins keep more weight
    than rare large losses). ``scope`` is ``group`` (per start state) or ``batch``. A group (or batch)
    whose rewards are all equal normalises to exactly 0 (NaN entries, failed episodes, stay NaN).
    """
    shift, scale = reward_normalization_terms(rewards, group_size, method, scope)
    normalized = torch.where(torch.isinf(scale), rewards * 0.0, (rewards - shift) / scale)
    if method == "asym_clip":
        normalized = normalized.clamp(min=-clip, max=3 * clip)
    return normalized


def place_rewards(shape, turn_rewards: list[list[float]], turn_ends: list[list[int]], per_turn: bool) -> torch.Tensor:
    """Token-level reward tensor: each turn's reward on that turn's last model token (``per_turn``),
    or the whole trajectory's reward on its last model token. Returns (B, T) float."""
    rewards = torch.zeros(shape)
    for b, (rs, ends) in enumerate(zip(turn_rewards, turn_ends)):
        if not ends:
            continue
        if per_turn:
            for r, e in zip(rs, ends):
                rewards[b, e] += r
        else:
            rewards[b, ends[-1]] += sum(rs)
    return rewards


def masked_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over model tokens only. rewards, values, mask: (B, T) -> (advantages, returns), each (B, T).

    Positions with ``mask == 0`` (environment tokens, padding) are skipped: the "next value" of a
    model token is the value at the NEXT MODEL token (0 after the last one), so observation tokens
    neither bootstrap nor discount. Masked positions get advantage and return 0.
    """
    B, T = rewards.shape
    adv = torch.zeros_like(values, dtype=torch.float32)
    next_value = torch.zeros(B, dtype=torch.float32, device=values.device)
    next_adv = torch.zeros(B, dtype=torch.float32, device=values.device)
    m = mask.bool()
    for t in range(T - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(m[:, t], a, torch.zeros_like(a))
        next_value = torch.where(m[:, t], values[:, t].float(), next_value)
        next_adv = torch.where(m[:, t], a, next_adv)
    returns = (adv + values) * m
    return adv, returns


def turn_end_mask(turn_ends: list[list[int]], mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (B, T) kept only at each turn's last model token. (B, T) -> (B, T)."""
    ends = torch.zeros_like(mask)
    for b, row in enumerate(turn_ends):
        for e in row:
            if 0 <= e < mask.shape[1]:
                ends[b, e] = mask[b, e]
    return ends


def turn_spans(turn_ends: list[int], mask_row: torch.Tensor) -> list[list[int]]:
    """Model-token positions of each turn: the model tokens after the previous turn's end up to this one's."""
    spans, start = [], 0
    model = mask_row.bool().tolist()
    for end in turn_ends:
        spans.append([t for t in range(start, end + 1) if model[t]])
        start = end + 1
    return spans


def bilevel_gae(
    turn_rewards: list[list[float]],
    turn_ends: list[list[int]],
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    turn_gamma: float,
    turn_lambda: float | None = None,
    turn_level_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bi-level GAE (turn-aware credit). values, mask: (B, T) -> (advantages, returns), each (B, T).

    Turn level: GAE across turns with discount ``turn_gamma`` (and ``turn_lambda``, default
    ``lam``) on the values at each turn's last model token, with the turn rewards ``R_k``:
    ``delta_k = R_k + turn_gamma * V_{k+1} - V_k``, ``G_k = A_k + V_k``. Token level: inside turn k,
    the last model token gets ``G_k - V_last = A_k`` exactly (its target is ``G_k``, undiscounted),
    earlier tokens GAE with ``gamma``/``lam`` over the turn's model tokens. A perfect critic gets 0. ``turn_level_only`` (``turn_gae``) gives every model token of turn k
    the turn advantage ``A_k``. Turn ends come from the episode engine, never from where rewards
    are non-zero: a turn with reward 0 is still a turn.
    """
    turn_lambda = lam if turn_lambda is None else turn_lambda
    adv = torch.zeros_like(values, dtype=torch.float32)
    returns = torch.zeros_like(values, dtype=torch.float32)
    for b, (rs, ends) in enumerate(zip(turn_rewards, turn_ends)):
        if not ends:
            continue
        v_end = [float(values[b, e]) for e in ends]
        K = len(ends)
        turn_adv = [0.0] * K
        next_v, next_a = 0.0, 0.0
        for k in range(K - 1, -1, -1):
            delta = rs[k] + turn_gamma * next_v - v_end[k]
            turn_adv[k] = delta + turn_gamma * turn_lambda * next_a
            next_v, next_a = v_end[k], turn_adv[k]
        for k, span in enumerate(turn_spans(ends, mask[b])):
            G = turn_adv[k] + v_end[k]
            if turn_level_only:
                for t in span:
                    adv[b, t], returns[b, t] = turn_adv[k], G
                continue
            # The turn's last token carries exactly the turn advantage: its target is G_k itself (no
            # discount: the turn level already discounted across turns). Earlier tokens bootstrap
            # from the next token of the turn with gamma / lam.
            next_v, next_a = G, 0.0
            for j, t in enumerate(reversed(span)):
                v = float(values[b, t])
                a = G - v if j == 0 else gamma * next_v - v + gamma * lam * next_a
                adv[b, t], returns[b, t] = a, a + v
                next_v, next_a = v, a
    return adv, returns
