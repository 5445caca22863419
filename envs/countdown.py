"""Countdown: combine the given numbers with + - * / to hit the target. One answer, one turn.

## Description
Three or four numbers and a target that is always reachable: the target is built by combining
all the numbers in a random order with random operators (exact integer intermediate results).
The answer is an arithmetic expression using each given number exactly once; it is parsed by
``envs.expression`` (numbers, binary + - * /, parentheses; never ``eval``). ``expr = value`` is
accepted and only the left side is scored. A unary sign (``-7 + 9``) is not allowed: ``-7`` is not
a given number.

## Actions
Free text (``action_names`` is None): an expression such as ``(7 - 3) * 5 + 2``.

## Observation
::

    Numbers: 7, 3, 5, 2
    Target: 22

## Rewards
1.0 for an expression that uses exactly the given numbers and equals the target, 0.1 for one that
uses exactly the given numbers but misses, 0 otherwise (wrong numbers, unparseable, too long).

## Termination
Terminated after the first answer, valid or not. ``success`` means reward 1.

## Arguments
``num_numbers=(3, 4)`` (a count, or a tuple to draw from), ``max_number=20``, ``max_target=100``,
``render_mode=None | "ansi"``.

## Version history
v0: first version; unary signs rejected.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from itertools import combinations

import numpy as np

from envs.base import TextEnv, step_info
from envs.expression import parse_expression

MAX_ATTEMPTS = 50


def make_puzzle(rng: np.random.Generator, counts, max_number: int, max_target: int) -> tuple[list[int], int]:
    """Numbers and a reachable target in ``[1, max_target]``, deterministic in ``rng``."""
    for _ in range(MAX_ATTEMPTS):
        n = int(rng.choice(counts))
        numbers = [int(v) for v in rng.integers(1, max_number + 1, size=n)]
        order = [numbers[i] for i in rng.permutation(n)]
        value = order[0]
        for x in order[1:]:
            ops = ["+", "-", "*"] + (["/"] if x != 0 and value % x == 0 else [])
            op = ops[int(rng.integers(len(ops)))]
            value = {"+": value + x, "-": value - x, "*": value * x, "/": value // x if x else value}[op]
        if 1 <= value <= max_target:
            return numbers, int(value)
    return numbers, sum(numbers)


def solve(numbers: list[int], target: int) -> str | None:
    """An expression using every number once that equals ``target``, or None (exhaustive search)."""
    items = [(Fraction(n), str(n)) for n in numbers]
    return _search(items, Fraction(target))


def _search(items, target):
    if len(items) == 1:
        return items[0][1] if items[0][0] == target else None
    for i, j in combinations(range(len(items)), 2):
        (a, ea), (b, eb) = items[i], items[j]
        rest = [items[k] for k in range(len(items)) if k not in (i, j)]
        candidates = [
            (a + b, f"({ea} + {eb})"),
            (a * b, f"{ea} * {eb}"),
            (a - b, f"({ea} - {eb})"),
            (b - a, f"({eb} - {ea})"),
        ]
        if b != 0:
            candidates.append((a / b, f"{ea} / {eb}"))
        if a != 0:
            candidates.append((b / a, f"{eb} / {ea}"))
        for value, expr in candidates:
            found = _search(rest + [(value, f"({expr})" if "/" in expr or "*" in expr else expr)], target)
            if found is not None:
                return found
    return None


def strip_outer(expr: str) -> str:
    while expr.startswith("(") and expr.endswith(")") and parse_expression(expr[1:-1]) is not None:
        expr = expr[1:-1]
    return expr


def score_answer(answer: str, numbers: list[int], target: int) -> tuple[float, bool]:
    """``(reward, parsed)`` for an answer, by the rules in the module docstring."""
    if not isinstance(answer, str):
        return 0.0, False
    parsed = parse_expression(answer.split("=")[0], allow_unary=False)
    if parsed is None:
        return 0.0, False
    value, used = parsed
    if Counter(used) != Counter(Fraction(n) for n in numbers):
        return 0.0, True
    return (1.0 if value == target else 0.1), True


class CountdownEnv(TextEnv):
    action_names = None

    def __init__(
        self, num_numbers=(3, 4), max_number: int = 20, max_target: int = 100, render_mode: str | None = None
    ):
        super().__init__(render_mode)
        self.counts = [num_numbers] if isinstance(num_numbers, int) else list(num_numbers)
        if not self.counts or min(self.counts) < 2:
            raise ValueError(f"num_numbers must be at least 2, got {num_numbers!r}")
        self.max_number, self.max_target = max_number, max_target
        self.instructions = (
            "You are playing Countdown. Combine all the given numbers, each exactly once, with + - * / and "
            "parentheses to reach the target. Answer with the expression only, e.g. (7 - 3) * 5 + 2. "
            "Reward: 1 if it equals the target, 0.1 if it uses exactly the given numbers but misses, 0 otherwise."
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.numbers, self.target = make_puzzle(self.np_random, self.counts, self.max_number, self.max_target)
        self.answered = False
        return self.render_text(), step_info(False, True, False)

    def step(self, action: str):
        reward, valid = score_answer(action, self.numbers, self.target)
        effective = not self.answered
        self.answered = True
        return self.render_text(), reward, True, False, step_info(reward == 1.0, valid, effective)

    def render_text(self) -> str:
        return f"Numbers: {', '.join(map(str, self.numbers))}\nTarget: {self.target}"

    def expert_action(self) -> str:
        expr = solve(self.numbers, self.target)
        return strip_outer(expr) if expr is not None else " + ".join(map(str, self.numbers))
