"""Reasoning-aware reward shaping (the paper's finding 6), off by default.

Per turn, on the parsed think text: a bonus for a non-empty think within word bounds, a penalty
for copying the previous turn's think verbatim, and an optional user hook. Pure functions; the
episode engine adds the result to the turn's reward (like the format penalty), never to success.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


class ReasoningRewardFn(Protocol):
    def __call__(self, think: str | None, answer: str | None, previous_think: str | None, turn: int) -> float:
        """Extra reward for one turn's reasoning (``turn`` counts from 1)."""
        ...


@dataclass(frozen=True)
class ThinkShaping:
    bonus: float = 0.0
    min_words: int = 1
    max_words: int = 100
    copy_penalty: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.bonus != 0.0 or self.copy_penalty != 0.0


def _normalise(text: str) -> str:
    return " ".join(text.split())


def think_reward(think: str | None, previous_think: str | None, shaping: ThinkShaping) -> float:
    """``bonus`` if ``think`` has ``min_words..max_words`` words (and is not empty); minus
    ``copy_penalty`` if it equals the previous turn's think (whitespace-normalised)."""
    if not think or not think.strip():
        return 0.0
    reward = 0.0
    if shaping.bonus and max(1, shaping.min_words) <= len(think.split()) <= shaping.max_words:
        reward += shaping.bonus
    if shaping.copy_penalty and previous_think and _normalise(think) == _normalise(previous_think):
        reward -= shaping.copy_penalty
    return reward


def turn_shaping_reward(
    think: str | None,
    answer: str | None,
    previous_think: str | None,
    turn: int,
    shaping: ThinkShaping,
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
