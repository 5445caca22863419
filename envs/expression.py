"""A safe arithmetic parser for model answers: numbers, + - * /, parentheses. Nothing else.

Model text never reaches ``eval``: the answer is parsed with ``ast`` (which only builds a tree) and
the tree is walked by hand, rejecting every node that is not a number or one of the four
operators. Results are exact ``Fraction``s. Any failure (syntax, a name, a call, division by zero,
an over-long or over-deep expression) returns ``None``, which the envs score as a wrong answer.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

MAX_CHARS = 200
MAX_NUMBER_DIGITS = 12
_ALLOWED = re.compile(r"^[0-9+\-*/(). ]*$")
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


_NUMBER = re.compile(r"^([+-]?)(\d{1,12})(?:\.(\d{1,12})|/(\d{1,12}))?$")


def parse_number(text: str) -> Fraction | None:
    """A single number: an integer (``42``, ``-7``), a decimal (``3.5``) or a fraction in lowest terms
    (``7/2``); None for anything else, expressions included (``6 * 7``, ``84/12``)."""
    if not isinstance(text, str):
        return None
    match = _NUMBER.match(text.strip())
    if match is None:
        return None
    sign, whole, decimals, denominator = match.groups()
    if denominator is not None:
        value = Fraction(int(whole), int(denominator)) if int(denominator) > 0 else None
        if value is None or value.denominator != int(denominator) or value.denominator == 1:
            return None  # 84/12 restates a computation; 7/1 is not how a number is written
    else:
        value = Fraction(f"{whole}.{decimals}") if decimals is not None else Fraction(int(whole))
    return -value if sign == "-" else value


def parse_expression(text: str, allow_unary: bool = True) -> tuple[Fraction, list[Fraction]] | None:
    """Return ``(value, numbers used in order)`` for an arithmetic expression, or None.
    ``allow_unary=False`` rejects unary ``+``/``-`` (``-7`` is not the given number 7)."""
    if not isinstance(text, str):
        return None
    text = text.strip().replace("×", "*").replace("÷", "/")
    if not text or len(text) > MAX_CHARS or not _ALLOWED.match(text):
        return None
    try:
        tree = ast.parse(text, mode="eval")
        numbers: list[Fraction] = []
        value = _walk(tree.body, numbers, depth=0, allow_unary=allow_unary)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError, OverflowError, TypeError):
        return None
    return value, numbers


def _walk(node, numbers, depth, allow_unary=True):
    if depth > 60:
        raise ValueError("expression too deep")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if len(str(node.value)) > MAX_NUMBER_DIGITS:
            raise ValueError("number too long")
        number = Fraction(str(node.value))
        numbers.append(number)
        return number
    if allow_unary and isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _walk(node.operand, numbers, depth + 1, allow_unary)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _walk(node.left, numbers, depth + 1, allow_unary)
        right = _walk(node.right, numbers, depth + 1, allow_unary)
        if isinstance(node.op, ast.Div):
            return left / right
        op = _OPS.get(type(node.op))
        if op is not None:
            return op(left, right)
    raise ValueError(f"not allowed: {type(node).__name__}")


def format_number(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
