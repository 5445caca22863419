"""What a critic gives one training step: per-token advantages and the targets it learns from.

``critic_targets`` runs the critic over the step's rows (its values before this step's update,
PPO's "old values"), turns per-turn rewards into per-token advantages and returns with the
configured estimator (``advantage_estimator``), picks the tokens the critic learns on and, with
``whiten_advantages``, whitens the advantages over the model tokens of the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from starpo_trl.algorithms.advantages import turn_end_mask
from starpo_trl.algorithms.estimators import get_estimator
from starpo_trl.algorithms.stats import whiten


@dataclass
class CriticTargets:
    advantages: torch.Tensor  # (B, T), zero off the model tokens
    values: torch.Tensor  # the critic's values before this step's update, zero off the model tokens
    returns: torch.Tensor  # what the critic regresses on
    value_mask: torch.Tensor  # the tokens it learns on


def critic_targets(
    critic,
    rows: list,
    turn_rewards: list[list[float]],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    loss_mask: torch.Tensor,
    args,
    sum_over_processes: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> CriticTargets:
    """Targets for this process's ``rows`` (``Episode``s: kept episodes, then padding rows).

    ``turn_rewards`` are the kept episodes' (``algorithms.scoring.critic_turn_rewards``); rows after
    them are padding and get zero rewards. ``args`` gives ``advantage_estimator`` and its settings,
    ``value_loss_tokens`` (``"all"`` model tokens, or VAGEN's ``"turn_ends"``: each turn's last model
    token) and ``whiten_advantages``. ``sum_over_processes`` sums a tensor over processes, so the
    whitening statistics are the whole batch's, as on one process.
    """
    values = critic.values(input_ids, attention_mask, logits_to_keep, args.per_device_train_batch_size) * loss_mask
    ends = [ep.turn_end_positions for ep in rows]
    turn_rewards = list(turn_rewards) + [[0.0] * len(ep.turn_rewards) for ep in rows[len(turn_rewards) :]]
    advantages, returns = get_estimator(args.advantage_estimator).fn(turn_rewards, ends, values, loss_mask, args)
    value_mask = loss_mask if args.value_loss_tokens == "all" else turn_end_mask(ends, loss_mask)
    if args.whiten_advantages:
        m = loss_mask.bool()
        x = advantages[m].double()
        stats = torch.stack([m.sum().double(), x.sum(), (x * x).sum()])
        if sum_over_processes is not None:
            stats = sum_over_processes(stats)
        advantages = whiten(advantages, loss_mask, tuple(stats.tolist()))
    return CriticTargets(advantages, values, returns, value_mask)


def fit_critic(
    critic, inputs: tuple, targets: CriticTargets, num_rows: int, args, step: int, reduce=None
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
        args.critic_epochs,
        args.steps_per_generation,
        torch.Generator().manual_seed(args.seed * 1_000_003 + step),
        args.max_grad_norm,
        reduce=reduce,
    )
    return [{f"critic/{key}": value for key, value in s.items()} for s in stats]
