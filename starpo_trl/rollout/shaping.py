"""Reasoning-aware reward shaping (the paper's finding 6), off by default.

Per turn, on the parsed think text: a bonus for a non-empty think within word bounds, a penalty
for copying the previous turn's think verbatim, and an optional user hook. Pure functions; the
episode engine adds the result to the turn's reward (like the format penalty), never to success.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from starpo_trl.rollout.settings import RolloutSettings


class ReasoningRewardFn(Protocol):
    def __call__(self, think: str | None, answer: str | None, previous_think: str | None, turn: int) -> float:
        """Extra reward for one turn's reasoning (``turn`` counts from 1)."""
        ...


def _normalise(text: str) -> str:
    return " ".join(text.split())


def think_reward(think: str | None, previous_think: str | None, shaping: RolloutSettings) -> float:
    """``think_bonus`` if ``think`` has ``think_min_words..think_max_words`` words (and is not empty); minus
    ``think_copy_penalty`` if it equals the previous turn's think (whitespace-normalised)."""
    if not think or not think.strip():
        return 0.0
    reward = 0.0
    if shaping.think_bonus and max(1, shaping.think_min_words) <= len(think.split()) <= shaping.think_max_words:
        reward += shaping.think_bonus
    if shaping.think_copy_penalty and previous_think and _normalise(think) == _normalise(previous_think):
        reward -= shaping.think_copy_penalty
    return reward


def turn_shaping_reward(
    think: str | None,
    answer: str | None,
    previous_think: str | None,
    turn: int,
    shaping: RolloutSettings,
    hook: Callable | None = None,
) -> float:
    """All shaping for one turn: ``think_reward`` plus the user's hook, if any."""
    reward = think_reward(think, previous_think, shaping)
    if hook is not None:
        extra = float(hook(think, answer, previous_think, turn))
        if extra != extra or extra in (float("inf"), float("-inf")):
            raise ValueError(f"reasoning_reward_fn returned {extra} for turn {turn}: it must return a finite float.")
        reward += extra
    return reward
