"""The advantage estimators by name: ``advantage_estimator`` in ``StarPOConfig`` picks one.

Three kinds:

- group estimators (``critic=False``) see each kept trajectory's (normalised) reward and its group:
  ``fn(rewards, group_size, scale_rewards) -> advantages`` of shape (N,), one per trajectory;
- turn estimators (``per_turn=True``, no critic) also see each trajectory's turn rewards and the state
  each turn started from: ``fn(rewards, turn_rewards, anchors, group_size, settings) -> advantages``, a
  list per trajectory with one advantage per turn (``gigpo``; ``settings`` carries ``turn_gamma``,
  ``gigpo_mode``, ``step_advantage_weight``);
- critic estimators (``critic=True``) see the turn rewards, each turn's last model token and the
  critic's values: ``fn(turn_rewards, turn_ends, values, mask, settings) -> (advantages, returns)``,
  both (B, T) over completion tokens; ``settings`` carries ``gamma``, ``lam``, ``turn_gamma``,
  ``turn_lambda`` (the ``StarPOConfig``).

Register your own with ``@register_advantage_estimator("name", critic=...)`` before the config is
built; ``StarPOConfig(advantage_estimator="name")`` then accepts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from starpo_trl.algorithms.advantages import (
    batch_mean_advantages,
    bilevel_gae,
    grpo_advantages,
    masked_gae,
    place_rewards,
    rloo_advantages,
)
from starpo_trl.algorithms.gigpo import gigpo_advantages
from starpo_trl.rollout.batch import turn_token_values


@dataclass(frozen=True)
class Estimator:
    name: str
    critic: bool
    fn: Callable
    per_turn: bool = False


ESTIMATORS: dict[str, Estimator] = {}


def register_advantage_estimator(name: str, critic: bool = False, per_turn: bool = False, replace: bool = False):
    """Decorator: register ``fn`` as the advantage estimator ``name`` (see the module docstring). A name already
    registered is refused unless ``replace=True`` (a notebook cell run twice)."""
    if critic and per_turn:
        raise ValueError("an estimator is a critic estimator or a turn estimator, not both")
    if name in ESTIMATORS and not replace:
        raise ValueError(
            f"advantage estimator {name!r} is already registered: pick another name, or pass replace=True"
        )

    def register(fn):
        ESTIMATORS[name] = Estimator(name, critic, fn, per_turn)
        return fn

    return register


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"advantage_estimator must be one of {sorted(ESTIMATORS)}, got {name!r}")
    return ESTIMATORS[name]


def turn_advantages(episodes, scored, settings, group_size: int, mine: slice, rows, owner, width: int) -> torch.Tensor:
    """A turn estimator's (``settings.advantage_estimator``, e.g. ``gigpo``; ``settings``: the
    ``AdvantageSettings``) per-token advantages ``(len(rows), width)`` for this process's training ``rows``
    (``owner``: each one's kept episode, in its share ``mine`` of ``scored.keep``). Computed on the whole kept batch
    ``episodes[scored.keep]`` (a group's episodes may be dealt to several processes; ``group_size`` episodes per
    group) from their normalised rewards, turn rewards and anchor states."""
    kept = [episodes[i] for i in scored.keep.tolist()]
    per_turn = get_estimator(settings.advantage_estimator).fn(
        scored.kept_rewards.tolist(),
        [ep.turn_rewards for ep in kept],
        [ep.turn_states for ep in kept],
        group_size,
        settings,
    )
    return turn_token_values(rows, owner, per_turn[mine], width)


def critic_estimators() -> list[str]:
    """The names of the estimators that need a critic."""
    return sorted(n for n, e in ESTIMATORS.items() if e.critic)


@register_advantage_estimator("grpo")
def _grpo(rewards: torch.Tensor, group_size: int, scale: str) -> torch.Tensor:
    return grpo_advantages(rewards, group_size, scale)


@register_advantage_estimator("rloo")
def _rloo(rewards: torch.Tensor, group_size: int, scale: str) -> torch.Tensor:
    return rloo_advantages(rewards, group_size)


@register_advantage_estimator("reinforce_pp")
def _reinforce_pp(rewards: torch.Tensor, group_size: int, scale: str) -> torch.Tensor:
    return batch_mean_advantages(rewards, scale)


@register_advantage_estimator("gae", critic=True)
def _gae(turn_rewards, turn_ends, values, mask, settings):
    token_rewards = place_rewards(values.shape, turn_rewards, turn_ends, per_turn=True).to(values.device)
    return masked_gae(token_rewards, values, mask, settings.gamma, settings.lam)


def _bilevel(turn_rewards, turn_ends, values, mask, settings, turn_level_only: bool):
    advantages, returns = bilevel_gae(
        turn_rewards,
        turn_ends,
        values.cpu(),
        mask.cpu(),
        settings.gamma,
        settings.lam,
        settings.turn_gamma,
        settings.turn_lambda,
        turn_level_only=turn_level_only,
    )
    return advantages.to(values.device), returns.to(values.device)


@register_advantage_estimator("bilevel_gae", critic=True)
def _bilevel_gae(turn_rewards, turn_ends, values, mask, settings):
    return _bilevel(turn_rewards, turn_ends, values, mask, settings, turn_level_only=False)


@register_advantage_estimator("turn_gae", critic=True)
def _turn_gae(turn_rewards, turn_ends, values, mask, settings):
    return _bilevel(turn_rewards, turn_ends, values, mask, settings, turn_level_only=True)


@register_advantage_estimator("gigpo", per_turn=True)
def _gigpo(rewards, turn_rewards, anchors, group_size, settings):
    return gigpo_advantages(
        rewards,
        turn_rewards,
        anchors,
        group_size,
        settings.turn_gamma,
        settings.gigpo_mode,
        settings.step_advantage_weight,
    )
