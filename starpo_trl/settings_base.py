"""``Settings``: the base of every layer's typed settings dataclass (``RolloutSettings``, ``FilterSettings``, ...).

``StarPOConfig`` is composed from these classes (their fields are its flat fields); ``Settings.of(config)`` reads one
class's own fields back out of a config, so a lower layer receives its own settings and nothing else.
"""

from __future__ import annotations

from dataclasses import fields


class Settings:
    """A mixin for a settings dataclass: ``of(config)`` and ``values()``."""

    @classmethod
    def of(cls, config):
        """An instance of ``cls`` with each field read from ``config``'s field of the same name."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})

    def values(self) -> dict:
        """The fields of ``cls`` (not of a config it is part of) and their values."""
        return {f.name: getattr(self, f.name) for f in fields(type(self))}
