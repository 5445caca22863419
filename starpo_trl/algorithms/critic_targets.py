"""What a critic gives one training step: per-token advantages and the targets it learns from.

``critic_targets`` runs the critic over the step's rows (its values before this step's update,
PPO's "old values"), turns per-turn rewards into per-token advantages and returns with the
configured estimator (``advantage_estimator``), picks the tokens the critic learns on and, with
``whiten_advantages``, whitens the advantages over the model tokens of the whole batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from starpo_trl.algorithms.advantages import turn_end_mask
from starpo_trl.algorithms.estimators import get_estimator
from starpo_trl.algorithms.settings import AdvantageSettings, CriticSettings
from starpo_trl.algorithms.stats import whiten
from starpo_trl.rollout.settings import context_window_turns


@dataclass(frozen=True)
class TargetSettings:
    """What ``critic_targets`` and ``fit_critic`` read, each from the layer that owns it: the estimator and its
    discounts (``AdvantageSettings``); the critic's loss tokens, whitening and epochs (``CriticSettings``); whether
    the rows are one per turn (decided once, from the context window: ``RolloutSettings.context_window``); and the
    run's micro-batch, micro-batches per rollout, seed and gradient clip (TRL's training arguments)."""

    advantages: AdvantageSettings
    critic: CriticSettings
    turn_rows: bool
    micro_batch: int
    micro_batches: int
    seed: int
    max_grad_norm: float

    @classmethod
    def of(cls, config) -> TargetSettings:
        """Read from a ``StarPOConfig`` (or anything with its field names)."""
        return cls(
            AdvantageSettings.of(config),
            CriticSettings.of(config),
            context_window_turns(config.context_window) is not None,
            config.per_device_train_batch_size,
            config.steps_per_generation,
            config.seed,
            config.max_grad_norm,
        )


@dataclass
class CriticTargets:
    advantages: torch.Tensor  # (B, T), zero off the model tokens
    values: torch.Tensor  # the critic's values before this step's update, zero off the model tokens
    returns: torch.Tensor  # what the critic regresses on
    value_mask: torch.Tensor  # the tokens it learns on


def critic_targets(
    critic,
    rows: list,
    owner: list[int],
    turn_rewards: list[list[float]],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    loss_mask: torch.Tensor,
    settings: TargetSettings,
    sum_over_processes: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> CriticTargets:
    """Targets for this process's ``rows`` (``Episode``s: the kept episodes' training rows, then padding).

    ``owner[i]`` is the kept episode of row ``i`` (padding rows have none) and ``turn_rewards`` are the
    kept episodes' (``algorithms.scoring.critic_turn_rewards``). With one row per episode the estimator
    runs on the rows as they are. With a context window (one row per turn, each with the context the
    model saw) each row's values come from its own context, and the estimator runs on each episode's
    replies joined in turn order (``join_turn_rows``): GAE bootstraps from turn t to turn t+1 exactly as
    over a whole-history row, whose env tokens it skips. ``settings`` gives the estimator and its discounts, the
    row layout, ``value_loss_tokens`` (``"all"`` model tokens, or VAGEN's ``"turn_ends"``: each turn's last
    model token) and ``whiten_advantages``. ``sum_over_processes`` sums a tensor over processes, so the
    whitening statistics are the whole batch's, as on one process.
    """
    values = critic.values(input_ids, attention_mask, logits_to_keep, settings.micro_batch) * loss_mask
    estimator, discounts = get_estimator(settings.advantages.advantage_estimator).fn, settings.advantages
    row_ends = [ep.turn_end_positions for ep in rows]
    if not settings.turn_rows:  # one row per episode (then padding, with zero rewards)
        rewards = list(turn_rewards) + [[0.0] * len(ep.turn_rewards) for ep in rows[len(turn_rewards) :]]
        advantages, returns = estimator(rewards, row_ends, values, loss_mask, discounts)
    else:
        layout = join_turn_rows(owner, [len(ep.completion_ids) for ep in rows[: len(owner)]], len(turn_rewards))
        ends = [[p - 1 for p in itertools.accumulate(n for _, n in turns)] for turns in layout]
        joined = estimator(
            turn_rewards, ends, gather_turn_rows(values, layout), gather_turn_rows(loss_mask, layout), discounts
        )
        advantages, returns = (scatter_turn_rows(x, layout, values.shape) for x in joined)
    value_mask = loss_mask if settings.critic.value_loss_tokens == "all" else turn_end_mask(row_ends, loss_mask)
    if settings.critic.whiten_advantages:
        m = loss_mask.bool()
        x = advantages[m].double()
        stats = torch.stack([m.sum().double(), x.sum(), (x * x).sum()])
        if sum_over_processes is not None:
            stats = sum_over_processes(stats)
        advantages = whiten(advantages, loss_mask, tuple(stats.tolist()))
    return CriticTargets(advantages, values, returns, value_mask)


def join_turn_rows(owner: list[int], lengths: list[int], num_episodes: int) -> list[list[tuple[int, int]]]:
    """Each episode's turn rows in turn order, as ``(row, reply length)``: how its replies join into one
    sequence (``owner[i]``: row ``i``'s episode; ``lengths[i]``: its completion, i.e. the turn's reply)."""
    layout: list[list[tuple[int, int]]] = [[] for _ in range(num_episodes)]
    for row, (k, n) in enumerate(zip(owner, lengths)):
        layout[k].append((row, n))
    return layout


def _spans(layout: list[list[tuple[int, int]]]):
    """``(episode, row, start, length)`` of every reply: where row ``row``'s reply sits in its episode's
    joined sequence."""
    for k, turns in enumerate(layout):
        starts = itertools.accumulate((n for _, n in turns), initial=0)
        for (row, n), pos in zip(turns, starts):
            yield k, row, pos, n


def gather_turn_rows(x: torch.Tensor, layout: list[list[tuple[int, int]]]) -> torch.Tensor:
    """Rows (R, T) -> episodes (E, L): episode ``k``'s replies one after the other, right-padded with 0."""
    width = max([sum(n for _, n in turns) for turns in layout] + [1])
    out = x.new_zeros((len(layout), width))
    for k, row, pos, n in _spans(layout):
        out[k, pos : pos + n] = x[row, :n]
    return out


def scatter_turn_rows(y: torch.Tensor, layout: list[list[tuple[int, int]]], shape) -> torch.Tensor:
    """The inverse of ``gather_turn_rows``: episodes (E, L) -> rows ``shape`` (R, T), zero elsewhere."""
    out = y.new_zeros(shape)
    for k, row, pos, n in _spans(layout):
        out[row, :n] = y[k, pos : pos + n]
    return out


def fit_critic(
    critic, inputs: tuple, targets: CriticTargets, num_rows: int, settings: TargetSettings, step: int, reduce=None
) -> list[dict]:
    """The critic learns on one step's ``targets``, once per rollout batch and before the policy's update
    (the advantages already hold its values from before): ``critic_epochs`` passes over the first
    ``num_rows`` rows (the rest is padding; the same number on every process) in
    ``steps_per_generation`` micro-batches, in an order that is the same on every process and new every
    step. ``inputs`` is ``(input_ids, attention_mask, logits_to_keep)``; ``reduce(params)`` averages
    gradients over processes. Returns each update's statistics, keyed ``critic/<name>``."""
    input_ids, attention_mask, logits_to_keep = inputs
    real = slice(0, num_rows)
    stats = critic.fit(
        input_ids[real],
        attention_mask[real],
        logits_to_keep,
        targets.values[real],
        targets.returns[real],
        targets.value_mask[real],
        settings.critic.critic_epochs,
        settings.micro_batches,
        torch.Generator().manual_seed(settings.seed * 1_000_003 + step),
        settings.max_grad_norm,
        reduce=reduce,
    )
    return [{f"critic/{key}": value for key, value in s.items()} for s in stats]
