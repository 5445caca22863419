"""One rule for every numeric setting of a config dataclass, derived from the field's type and its declared range.

A field annotated ``int`` (or ``int | None``) takes a whole number, never a float or a bool; ``float`` takes any
finite number (NaN and inf are refused); ``None`` only where the annotation allows it; and the value must lie in
the range the config declares for that field. ``numeric_fields`` finds the fields from their annotations, and
``check_declared`` makes a config without a range for one of them fail at import, so a new field cannot miss the rule.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (``None``: unbounded); ``low_open`` / ``high_open`` make that end strict."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        left = "(" if self.low_open or self.low is None else "["
        right = ")" if self.high_open or self.high is None else "]"
        return f"{left}{low}, {high}{right}"


def numeric_fields(cls, own_only: bool = False) -> dict[str, tuple[type, bool]]:
    """``name -> (int or float, None allowed)`` for the fields of dataclass ``cls`` annotated as one number
    (``int``, ``float``, optionally ``| None``); ``own_only``: those of ``own_names``."""
    names = own_names(cls) if own_only else None
    out = {}
    for klass in reversed(cls.__mro__):
        for name, annotation in klass.__dict__.get("__annotations__", {}).items():
            if names is not None and name not in names:
                continue
            parts = _type_names(annotation)
            kinds = parts - {"None"}
            if kinds in ({"int"}, {"float"}):
                out[name] = (int if kinds == {"int"} else float, "None" in parts)
    return out


def own_names(cls) -> set[str]:
    """The fields declared in ``cls``'s own body or in a base class of the same package (the settings classes a
    config is composed from), not those inherited from another library's class (``GRPOConfig``'s)."""
    package = cls.__module__.split(".")[0]
    return {
        name
        for klass in cls.__mro__
        if klass is cls or klass.__module__.split(".")[0] == package
        for name in klass.__dict__.get("__annotations__", {})
    }


def _type_names(annotation) -> set[str]:
    """``{"int", "None"}`` for ``int | None`` written as text (postponed annotations) or as types."""
    if isinstance(annotation, str):
        return {p.strip() for p in annotation.split("|")}
    members = typing.get_args(annotation) or (annotation,)
    return {"None" if m is type(None) else getattr(m, "__name__", str(m)) for m in members}


def check_declared(cls, ranges: dict[str, Range], own_only: bool = False) -> None:
    """Every numeric field of ``cls`` has a declared range, and every range names such a field (at import)."""
    fields = set(numeric_fields(cls, own_only))
    missing, unknown = sorted(fields - set(ranges)), sorted(set(ranges) - fields)
    if missing or unknown:
        raise TypeError(
            f"{cls.__name__}: numeric fields without a declared range {missing}; ranges of no such field {unknown}"
        )


def check_number(
    name: str, value, kind: type, nullable: bool, allowed: Range = Range(), hint: str = "", in_range: bool = True
) -> None:
    """Raise ``ValueError`` saying what to give when ``value`` breaks the rule for a ``kind`` field
    (``in_range=False``: its kind and finiteness only)."""
    what = f"a whole number in {allowed}" if kind is int else f"a finite number in {allowed}"
    what += " or None" if nullable else ""
    hint = f" ({hint.rstrip('.')})" if hint else ""
    if value is None:
        if nullable:
            return
        raise ValueError(f"{name}=None: give {what}{hint}.")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r}: give {what}{hint}.")
    if kind is int and not isinstance(value, int):
        raise ValueError(f"{name}={value!r} is not a whole number: give {what}{hint}.")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: give {what}{hint}.")
    if in_range and value not in allowed:
        raise ValueError(f"{name}={value!r} is outside {allowed}: give {what}{hint}.")


def check_numbers(
    obj, ranges: dict[str, Range], own_only: bool = False, with_range: bool = True, cls: type | None = None
) -> None:
    """``check_number`` for every numeric field of dataclass instance ``obj`` (``with_range=False``: kind and
    finiteness only, for a config that gives its own messages for some ranges and checks them all afterwards);
    ``cls``: the class whose fields are checked (default ``type(obj)``; a user's subclass keeps its base's rule)."""
    from dataclasses import fields

    helps = {f.name: f.metadata.get("help", "") for f in fields(obj)}
    for name, (kind, nullable) in numeric_fields(cls or type(obj), own_only).items():
        check_number(name, getattr(obj, name), kind, nullable, ranges[name], helps.get(name, ""), with_range)
