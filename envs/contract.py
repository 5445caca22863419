"""Env checks that run before any model loads: the id exists, and the env keeps the text-env contract."""

from __future__ import annotations

import importlib
import inspect
import math

import gymnasium as gym


def env_name(env_id: str) -> str:
    """The short name used in metric keys: ``starpo/Sokoban-v0`` and ``my_pkg.envs:Maze-v0`` give
    ``Sokoban-v0`` and ``Maze-v0``."""
    return env_id.split(":")[-1].split("/")[-1]


def check_env_id(env_id: str, field_name: str = "env_id") -> None:
    """Raise a clear error when ``env_id`` is not registered (importing ``envs`` registers ours).

    ``module:EnvName-v0`` (Gymnasium's syntax) first imports ``module``, which registers the env: an
    env defined in the user's own package trains and evaluates from the command line.
    """
    import envs  # noqa: F401  (registers the starpo/* ids)

    key = env_id
    if ":" in env_id:
        module, key = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(
                f"{field_name}={env_id!r}: cannot import module {module!r} ({err}). Put the package that registers the "
                "env on PYTHONPATH (or install it)."
            ) from None
    if key not in gym.registry:
        known = sorted(k for k in gym.registry if k.startswith("starpo/"))
        raise ValueError(
            f"{field_name}={env_id!r} is not a registered Gymnasium env. Known starpo envs: {', '.join(known)}. "
            "Register your own with gymnasium.register(...) in a module and pass 'your.module:YourEnv-v0'."
        )


def check_env_kwargs(env_id: str, env_kwargs: dict, field_name: str = "env_id") -> None:
    """Refuse kwargs the env's constructor does not take, or of the wrong type.

    A value is checked against the parameter's default when it has one (a bool default takes only a
    bool: ``{"is_slippery": "false"}`` would silently be a truthy string; a float default takes ints
    too), and against a plain class annotation otherwise.
    """
    spec = gym.spec(env_id.split(":", 1)[-1] if ":" in env_id else env_id)
    entry = spec.entry_point
    if isinstance(entry, str):
        module, attr = entry.split(":")
        entry = getattr(importlib.import_module(module), attr)
    try:
        params = inspect.signature(entry).parameters
    except (TypeError, ValueError):  # a builtin or C entry point: nothing to check against
        return
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    make_own = set(inspect.signature(gym.make).parameters) - {"id", "kwargs"}  # e.g. max_episode_steps
    for name, value in env_kwargs.items():
        param = params.get(name)
        if name in make_own:
            continue
        if param is None:
            if accepts_any:
                continue
            raise ValueError(
                f"{field_name}={env_id!r} takes no argument {name!r}; it takes: {', '.join(p for p in params if p != 'self')}."
            )
        expected = _expected_types(param)
        wrong_bool = isinstance(value, bool) and bool not in expected
        if expected and value is not None and (wrong_bool or not isinstance(value, expected)):
            names = " or ".join(t.__name__ for t in expected)
            raise ValueError(
                f"{field_name}={env_id!r}: argument {name}={value!r} is a {type(value).__name__}, expected {names} "
                f"(in JSON: {'true/false' if bool in expected else 'a number' if int in expected else 'a ' + names})."
            )


def _expected_types(param) -> tuple:
    default = param.default
    if default is not inspect.Parameter.empty and default is not None:
        if isinstance(default, bool):
            return (bool,)
        if isinstance(default, (int, float)):
            return (int, float) if isinstance(default, float) else (int,)
        if isinstance(default, str):
            return (str,)
        if isinstance(default, (tuple, list)):
            return (tuple, list, int) if all(isinstance(x, int) for x in default) else (tuple, list)
        return ()
    annotation = param.annotation
    if isinstance(annotation, type) and annotation in (bool, int, float, str):
        return {bool: (bool,), int: (int,), float: (int, float), str: (str,)}[annotation]
    return ()


def check_env_contract(
    env_id: str, env_kwargs: dict, field_name: str = "env_id", seeds=(0, 1), steps: int = 3
) -> None:
    """Build the env and play a few steps; raise a clear error if it breaks the text-env contract.

    Checks: ``gymnasium.make`` accepts the kwargs, ``reset``/``step`` return string observations,
    rewards are finite numbers and ``info`` has ``success``, ``action_is_valid``,
    ``action_is_effective``. Costs a few milliseconds for the bundled envs.
    """
    check_env_kwargs(env_id, env_kwargs, field_name)
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
        raise ValueError(
            f"{field_name}={env_id!r}: {where} returned a {type(obs).__name__} observation; text envs return str."
        )
    try:
        ok = math.isfinite(float(reward))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            f"{field_name}={env_id!r}: {where} returned reward {reward!r}; rewards must be finite numbers (no NaN or inf)."
        )
    missing = {"success", "action_is_valid", "action_is_effective"} - set(info)
    if missing:
        raise ValueError(
            f"{field_name}={env_id!r}: {where} info lacks {sorted(missing)}; return envs.base.step_info(...) as info."
        )
