"""GiGPO: turn-level credit without a critic (Group-in-Group Policy Optimization, Feng et al., NeurIPS 2025).

GRPO's groups are the episodes that share a start state; GiGPO adds groups of turns: within a start state's
group, the turns that begin from the same environment state (an *anchor state*) form a step-level group.
Each turn's advantage is

    A(i, t) = A_episode(i) + step_advantage_weight * A_step(i, t)

- ``A_episode(i)``: episode ``i``'s reward against its group's (``mean_norm``: minus the group mean;
  ``mean_std_norm``: then over the group's unbiased std + 1e-6);
- ``A_step(i, t)``: the discounted return of turn ``t`` (``G_t = r_t + gamma * G_{t+1}``, the episode's
  turn rewards) normalised the same way within its anchor group. A turn alone in its anchor group gets
  ``A_step = 0``: only the episode advantage.

Episodes that failed (NaN reward) are left out of every statistic and get 0 on every turn; a group with
a single played episode gives it ``A_episode = 0``. Anchor keys are whatever the engine recorded per turn
(``Episode.turn_states``: the env's ``state_key()`` where it has one, else the observation text), compared
within a start state's group only.

Differences from the reference implementation (verl-agent, ``gigpo/core_gigpo.py``), by design: its rows are
turns, and by default (``compute_mean_std_cross_steps``) the episode statistics count an episode once per
turn; here once per episode (its ``compute_mean_std_cross_steps=False``), as GRPO does. A group with one
episode there passes the raw reward through (mean 0, std 1); here it gets 0, as a lone turn does.
"""

from __future__ import annotations

import math
from collections import defaultdict

GIGPO_MODES = ("mean_norm", "mean_std_norm")
GIGPO_EPS = 1e-6


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}`` for each turn, from the last back."""
    out, running = [], 0.0
    for reward in reversed(rewards):
        running = reward + gamma * running
        out.append(running)
    return out[::-1]


def relative(values: list[float], mode: str) -> list[float]:
    """Each value against its group's: minus the mean (``mean_norm``), then over the unbiased std + 1e-6
    (``mean_std_norm``); a group of one gives 0."""
    if mode not in GIGPO_MODES:
        raise ValueError(f"GiGPO mode must be one of {GIGPO_MODES}, got {mode!r}")
    if len(values) < 2:
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    centred = [v - mean for v in values]
    if mode == "mean_norm":
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (len(values) - 1))
    return [c / (std + GIGPO_EPS) for c in centred]


def gigpo_advantages(
    rewards: list[float],
    turn_rewards: list[list[float]],
    anchors: list[list],
    group_size: int,
    gamma: float,
    mode: str,
    step_advantage_weight: float,
) -> list[list[float]]:
    """Per-turn advantages of ``len(rewards)`` episodes in consecutive groups of ``group_size`` (a start
    state each). ``rewards``: each episode's (normalised) reward, NaN for a failed one; ``turn_rewards`` /
    ``anchors``: per episode, each turn's reward and the hashable key of the state it started from."""
    if len(rewards) % group_size or len(turn_rewards) != len(rewards) or len(anchors) != len(rewards):
        raise ValueError(
            "gigpo_advantages needs whole groups: one reward, turn-reward list and anchor list per episode"
        )
    out = [[0.0] * len(turns) for turns in turn_rewards]
    for first in range(0, len(rewards), group_size):
        played = [i for i in range(first, first + group_size) if not math.isnan(rewards[i])]
        episode = dict(zip(played, relative([float(rewards[i]) for i in played], mode)))
        by_anchor: dict = defaultdict(list)  # anchor state -> (episode, turn, discounted return)
        for i in played:
            if len(anchors[i]) != len(turn_rewards[i]):
                raise ValueError(f"episode {i} has {len(turn_rewards[i])} turns but {len(anchors[i])} anchor states")
            for t, (key, ret) in enumerate(zip(anchors[i], discounted_returns(turn_rewards[i], gamma))):
                by_anchor[key].append((i, t, ret))
        for members in by_anchor.values():
            for (i, t, _), step in zip(members, relative([ret for _, _, ret in members], mode)):
                out[i][t] = episode[i] + step_advantage_weight * step
    return out
