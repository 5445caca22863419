"""Arithmetic: procedurally generated math questions with one exact answer. One answer, one turn.

## Description
An offline stand-in for MetaMathQA: questions are generated from the seed, and every question has
one exact rational answer. Levels:

- 1: one operation on two numbers (``What is 17 + 25?``)
- 2: three numbers and two operations with parentheses (``What is (12 - 4) * 3?``)
- 3: a short word problem with two or three steps (shopping, sharing, saving).

## Actions
Free text (``action_names`` is None): the number, e.g. ``42``: an integer, a decimal (``3.5``)
or a fraction in lowest terms (``7/2``), parsed by ``envs.expression.parse_number``. An expression
(``6 * 7``, ``(16 + 23) * 12``, ``84/12``) is not a number and is an invalid answer: restating the
question would otherwise score.

## Observation
::

    Question: Ana buys 3 boxes of 12 pencils and gives away 5 pencils. How many pencils does she have?

## Rewards
1.0 for the exact answer, 0 otherwise (an expression instead of a number: 0, ``action_is_valid`` False).

## Termination
Terminated after the first answer. ``success`` means reward 1.

## Arguments
``level=(1, 2, 3)`` (a level, or a tuple to draw from), ``render_mode=None | "ansi"``.

## Version history
v0: first version; answers must be numbers (expressions accepted before paid for copying the question).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from envs.base import TextEnv, step_info
from envs.expression import format_number, parse_number

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana"]
ITEMS = [("box", "pencils"), ("bag", "apples"), ("pack", "cards"), ("crate", "bottles")]


def make_question(rng: np.random.Generator, level: int) -> tuple[str, Fraction]:
    r = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    if level == 1:
        a, b = r(2, 99), r(2, 99)
        op = ["+", "-", "*"][r(0, 2)]
        if op == "*":
            a, b = r(2, 20), r(2, 20)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return f"What is {a} {op} {b}?", Fraction(value)
    if level == 2:
        a, b, c = r(2, 30), r(2, 30), r(2, 12)
        form = r(0, 2)
        if form == 0:
            return f"What is ({a} + {b}) * {c}?", Fraction((a + b) * c)
        if form == 1:
            return f"What is ({a} - {b}) * {c}?", Fraction((a - b) * c)
        return f"What is {a * c} / {c} + {b}?", Fraction(a + b)
    name = NAMES[r(0, len(NAMES) - 1)]
    container, thing = ITEMS[r(0, len(ITEMS) - 1)]
    n, k = r(2, 9), r(3, 15)
    form = r(0, 2)
    if form == 0:
        g = r(1, n * k - 1)
        text = f"{name} buys {n} {_plural(container)} of {k} {thing} and gives away {g} {thing}. How many {thing} does {name} have?"
        return text, Fraction(n * k - g)
    if form == 1:
        friends = r(2, 6)
        total = friends * r(2, 12)
        text = f"{name} shares {total} {thing} equally among {friends} friends. How many {thing} does each friend get?"
        return text, Fraction(total, friends)
    per_week, weeks, spent = r(3, 20), r(2, 10), r(1, 20)
    text = f"{name} saves {per_week} dollars every week for {weeks} weeks, then spends {spent} dollars. How many dollars are left?"
    return text, Fraction(per_week * weeks - spent)


def _plural(container: str) -> str:
    return container + ("es" if container.endswith("x") else "s")


class ArithmeticEnv(TextEnv):
    action_names = None

    def __init__(self, level=(1, 2, 3), render_mode: str | None = None):
        super().__init__(render_mode)
        self.levels = [level] if isinstance(level, int) else list(level)
        if not self.levels or any(lv not in (1, 2, 3) for lv in self.levels):
            raise ValueError(f"level must be 1, 2, 3 or a tuple of them, got {level!r}")
        self.instructions = (
            "You are answering a math question. Answer with the exact number only, e.g. 42 "
            "(a fraction in lowest terms such as 7/2 is fine; an expression is not an answer). "
            "Reward: 1 for the exact answer, 0 otherwise."
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        level = self.levels[int(self.np_random.integers(len(self.levels)))]
        self.question, self.answer = make_question(self.np_random, level)
        self.answered = False
        return self.render_text(), step_info(False, True, False)

    def step(self, action: str):
        parsed = parse_number(action)
        correct = parsed is not None and parsed == self.answer
        effective = not self.answered
        self.answered = True
        return self.render_text(), float(correct), True, False, step_info(correct, parsed is not None, effective)

    def render_text(self) -> str:
        return f"Question: {self.question}"

    def expert_action(self) -> str:
        return format_number(self.answer)
