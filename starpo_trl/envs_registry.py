"""Env checks that run before any model loads: the id exists, and the env keeps the text-env contract."""

from __future__ import annotations

import math

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


def check_env_contract(env_id: str, env_kwargs: dict, field_name: str = "env_id", seeds=(0, 1), steps: int = 3) -> None:
    """Build the env and play a few steps; raise a clear error if it breaks the text-env contract.

    Checks: ``gymnasium.make`` accepts the kwargs, ``reset``/``step`` return string observations,
    rewards are finite numbers and ``info`` has ``success``, ``action_is_valid``,
    ``action_is_effective``. Costs a few milliseconds for the bundled envs.
    """
    try:
        env = gym.make(env_id, **env_kwargs)
    except TypeError as err:
        raise ValueError(f"{field_name}={env_id!r} does not accept env_kwargs={env_kwargs!r}: {err}") from None
    names = getattr(env.unwrapped, "action_names", None)
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        _check_step_output(env_id, field_name, obs, 0.0, info, "reset")
        for i in range(steps):
            action = names[i % len(names)] if names else "1"
            obs, reward, terminated, truncated, info = env.step(action)
            _check_step_output(env_id, field_name, obs, reward, info, "step")
            if terminated or truncated:
                break
    env.close()


def _check_step_output(env_id, field_name, obs, reward, info, where):
    if not isinstance(obs, str):
        raise ValueError(f"{field_name}={env_id!r}: {where} returned a {type(obs).__name__} observation; text envs return str.")
    try:
        ok = math.isfinite(float(reward))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{field_name}={env_id!r}: {where} returned reward {reward!r}; rewards must be finite numbers (no NaN or inf).")
    missing = {"success", "action_is_valid", "action_is_effective"} - set(info)
    if missing:
        raise ValueError(f"{field_name}={env_id!r}: {where} info lacks {sorted(missing)}; return envs.base.step_info(...) as info.")
