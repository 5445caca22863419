"""Several envs in one run: the ``env_configs`` / ``eval_env_configs`` settings of ``StarPOConfig``.

An env config is ``{"env_id": ..., "env_kwargs": {...}, "n_groups": k, "name": ...}``: ``n_groups``
(training only) start states of each step come from that env (every entry sets it, or none does and
the start states are split evenly); ``name`` (default: the env id without its namespace, e.g.
``Sokoban-v0``) keys its metrics, ``env/<name>/...``, and must differ between entries. A run with
one env is the one-entry case of the same thing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from datasets import Dataset

from envs.contract import env_name
from starpo_trl.rollout import StartState


@dataclass(frozen=True)
class EnvConfig:
    env_id: str
    env_kwargs: dict = field(default_factory=dict)
    n_groups: int | None = None
    name: str = ""

    @property
    def key(self) -> tuple[str, tuple]:
        """What a ``StartState`` carries: (env_id, sorted kwargs)."""
        return self.env_id, tuple(sorted(self.env_kwargs.items()))

    def starts(self, seeds) -> list[StartState]:
        """A start state in this env for each seed."""
        return [StartState(self.env_id, int(seed), self.key[1]) for seed in seeds]


def parse_env_configs(value, setting: str) -> list[EnvConfig]:
    """A list of env-config dicts (or its JSON string) as ``EnvConfig``s, each checked for its keys and their
    types; ``n_groups`` is a training setting (refused in ``eval_env_configs``); a ``name`` is a metric-key
    part (text without ``/``)."""
    held_out = setting.startswith("eval")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{setting} must be a list of env configs or its JSON string: {err}") from None
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(
            f'{setting} must be a non-empty list such as [{{"env_id": "starpo/Bandit-v0", "n_groups": 4}}]'
        )
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or not isinstance(entry.get("env_id"), str):
            raise ValueError(f"{setting}[{i}] must be a dict with an env_id (text), got {entry!r}")
        unknown = set(entry) - {"env_id", "env_kwargs", "n_groups", "name"}
        if unknown:
            raise ValueError(
                f"{setting}[{i}] has unknown keys {sorted(unknown)}: use env_id, env_kwargs, n_groups, name"
            )
        if held_out and entry.get("n_groups") is not None:
            raise ValueError(
                f"{setting}[{i}] sets n_groups, which splits training steps between envs; each held-out env plays "
                "num_eval_episodes episodes: remove it."
            )
        kwargs = entry.get("env_kwargs") or {}
        if isinstance(kwargs, str):
            try:
                kwargs = json.loads(kwargs)
            except json.JSONDecodeError as err:
                raise ValueError(f"{setting}[{i}].env_kwargs is not a JSON object: {err}") from None
        if not isinstance(kwargs, dict):
            raise ValueError(
                f'{setting}[{i}].env_kwargs must be a dict of keyword arguments such as {{"is_slippery": false}}, got {kwargs!r}'
            )
        n = entry.get("n_groups")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"{setting}[{i}].n_groups must be a whole number >= 1, got {n!r}")
        name = entry.get("name")
        if name is not None and (not isinstance(name, str) or not name or "/" in name):
            raise ValueError(
                f"{setting}[{i}].name={name!r}: give a non-empty text without '/' (metrics are logged as env/<name>/...)"
            )
        out.append(EnvConfig(entry["env_id"], dict(kwargs), n, name or env_name(entry["env_id"])))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{setting} names its envs {names}: give entries with the same env_id distinct 'name's")
    return out


def split_groups(configs: list[EnvConfig], num_start_states: int) -> list[int]:
    """How many start states of each step each training env gets."""
    given = [c.n_groups for c in configs]
    if all(n is None for n in given):
        if num_start_states % len(configs):
            raise ValueError(
                f"num_start_states={num_start_states} does not split evenly between {len(configs)} envs: "
                "set n_groups on every entry of env_configs, or a multiple of the number of envs."
            )
        return [num_start_states // len(configs)] * len(configs)
    if any(n is None for n in given):
        raise ValueError("Set n_groups on every entry of env_configs, or on none (an even split).")
    if sum(given) != num_start_states:
        raise ValueError(
            f"env_configs' n_groups add up to {sum(given)} but num_start_states={num_start_states}: make them agree."
        )
    return given


def group_envs(configs: list[EnvConfig], num_start_states: int) -> list[EnvConfig]:
    """The env of each of a step's groups, in order: the first env's groups first."""
    return [c for c, n in zip(configs, split_groups(configs, num_start_states)) for _ in range(n)]


def held_out_calls(
    env: EnvConfig, seeds: range, process_index: int, num_processes: int, per_call: int
) -> list[list[StartState]]:
    """This process's share of the held-out ``seeds`` in ``env`` (every ``num_processes``-th seed), in calls
    of at most ``per_call`` episodes (memory grows with episodes x history). Every process gets the same
    number of calls, the last ones possibly empty, as a collective backend needs."""
    mine = list(seeds)[process_index::num_processes]
    calls = math.ceil(math.ceil(len(seeds) / num_processes) / per_call)
    return [env.starts(mine[k * per_call : (k + 1) * per_call]) for k in range(calls)]


def start_state_dataset(seeds: range) -> Dataset:
    """One row per training start state (its seed); TRL's sampler repeats each row into a group."""
    return Dataset.from_dict({"seed": list(seeds)})


def process_starts(
    group_envs: list[EnvConfig], seeds: list[int], group_size: int, process_index: int
) -> list[StartState]:
    """A process's start states: the ``seeds`` of its groups (whole groups of ``group_size``, dealt to the
    processes in order), each in its group's env (``group_envs``: the env of each of a step's groups)."""
    first = process_index * (len(seeds) // group_size)
    return [group_envs[first + i // group_size].starts([seed])[0] for i, seed in enumerate(seeds)]


def metrics_name(configs: list[EnvConfig], start: StartState) -> str:
    """The name a start state's metrics are logged under: its env config's ``name`` (the env id without its
    namespace where no config matches)."""
    for env in configs:
        if env.env_id == start.env_id and env.key[1] == start.env_kwargs:
            return env.name
    return env_name(start.env_id)
