"""Env id checks that run before any model loads."""

from __future__ import annotations

import gymnasium as gym


def check_env_id(env_id: str, field_name: str = "env_id") -> None:
    """Raise a clear error when ``env_id`` is not registered (importing ``envs`` registers ours)."""
    import envs  # noqa: F401  (registers the starpo/* ids)

    if env_id not in gym.registry:
        known = sorted(k for k in gym.registry if k.startswith("starpo/"))
        raise ValueError(
            f"{field_name}={env_id!r} is not a registered Gymnasium env. Known starpo envs: {', '.join(known)}. "
            "Register your own with gymnasium.register(...) before building the config."
        )
