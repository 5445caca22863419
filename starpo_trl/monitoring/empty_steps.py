"""Steps with nothing to train on, counted, and the run stopped when they go on too long.

A step is empty when no kept row holds a model token: every kept episode failed before the model
wrote anything, or the rollout filter kept no group; with ``skip_zero_advantage_steps`` a step whose
advantages are all 0 is skipped too (its loss is also zeroed, so no backend sees the entropy bonus
alone). Such a step is skipped: as a Trainer callback,
``EmptySteps`` drops the gradients before its optimizer step, so AdamW leaves every weight and its
moments as they were (it skips parameters without a gradient; under DeepSpeed the engine steps
inside ``backward``, there the step runs with a zero gradient). It also says when to give up, with
an error that names the cause and what to change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from transformers import TrainerCallback

from starpo_trl.algorithms.settings import ScoringSettings


class TrainingStopped(RuntimeError):
    """A stop rule ended training: too many steps in a row with nothing to train on. The message names the cause
    and the setting to change; the model is as the last trained step left it (callers may still evaluate it)."""


class EmptySteps(TrainerCallback):
    """``max_empty_steps`` empty steps in a row (episodes failed), or ``rollout_filter_empty_stop_steps``
    steps in a row where the filter kept nothing, raise ``TrainingStopped`` (a ``RuntimeError``). ``scoring``: the filter's and the
    advantages' settings (``skip_zero_advantage_steps``, the filter stop and what its message names); ``envs``:
    the training envs the message names; ``parameters()`` gives the policy's parameters as they are trained
    (wrapped or not)."""

    def __init__(
        self,
        scoring: ScoringSettings,
        max_empty_steps: int,
        envs: str,
        parameters: Callable[[], Iterable[torch.nn.Parameter]],
    ):
        self.settings, self.max_empty_steps, self.envs = scoring, max_empty_steps, envs
        self.parameters = parameters
        self.skip = False  # whether the current step is skipped
        self.zero_advantage = False  # skipped because every advantage is 0 (its loss is zeroed)
        self.empty_in_a_row = 0
        self.filtered_out_in_a_row = 0

    @classmethod
    def of(cls, config, parameters: Callable[[], Iterable[torch.nn.Parameter]]) -> EmptySteps:
        """Read from a ``StarPOConfig``: its scoring settings, ``max_empty_steps`` and its training envs."""
        envs = ", ".join(sorted({env.env_id for env in config.train_envs()}))
        return cls(ScoringSettings.of(config), config.max_empty_steps, envs, parameters)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.skip:
            for p in self.parameters():
                p.grad = None

    def update(
        self, empty: bool, filtered_out: bool, zero_advantage: bool = False, cut_masked: bool = False
    ) -> dict[str, float]:
        """Count one training step (``empty``: no model token to train on; ``filtered_out``: because the
        filter kept no group; ``zero_advantage``: every kept advantage is 0, skipped only with
        ``skip_zero_advantage_steps``; ``cut_masked``: the kept episodes' replies were cut at their token limit
        and masked out of the loss by ``overlong_turns: mask``, which the stop's message then names); returns
        its ``rollout/empty_*`` (and ``zero_advantage_step``) metrics."""
        settings = self.settings
        self.zero_advantage = bool(settings.skip_zero_advantage_steps and zero_advantage and not empty)
        self.skip = empty or self.zero_advantage
        self.empty_in_a_row = self.empty_in_a_row + 1 if empty and not filtered_out else 0
        self.filtered_out_in_a_row = self.filtered_out_in_a_row + 1 if filtered_out else 0
        if self.filtered_out_in_a_row >= settings.rollout_filter_empty_stop_steps:
            raise TrainingStopped(
                f"The rollout filter kept no group {self.filtered_out_in_a_row} steps in a row "
                f"(rollout_filter_strategy={settings.rollout_filter_strategy!r}, metric={settings.rollout_filter_metric!r}, "
                f"include_zero={settings.rollout_filter_include_zero}): every group's score was zero or below the "
                "threshold, so the policy gets no signal (collapsed, or the task is too hard or too easy). Set "
                "rollout_filter_include_zero=True, lower rollout_filter_eps, use top_k, or raise "
                "rollout_filter_empty_stop_steps."
            )
        if self.empty_in_a_row >= self.max_empty_steps:
            cause = (
                "the kept episodes' replies were cut at max_tokens_per_turn and overlong_turns='mask' left them out "
                "of the loss (see rollout/cut_turn_fraction). Raise max_tokens_per_turn, set overlong_turns to "
                "'keep' or 'penalty', or raise max_empty_steps."
                if cut_masked
                else "every kept episode failed before the model wrote anything (see env/errors and the episodes' "
                f"env_error). Fix the env ({self.envs}) or raise max_empty_steps."
            )
            raise TrainingStopped(f"{self.empty_in_a_row} steps in a row had no model token to train on: {cause}")
        metrics = {"rollout/empty_step": float(empty), "rollout/empty_after_filter": float(filtered_out)}
        if settings.skip_zero_advantage_steps:
            metrics["rollout/zero_advantage_step"] = float(self.zero_advantage)
        return metrics

    def state_dict(self) -> dict[str, int]:
        return {"empty_steps_in_a_row": self.empty_in_a_row, "filtered_out_in_a_row": self.filtered_out_in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.empty_in_a_row = int(state.get("empty_steps_in_a_row", 0))
        self.filtered_out_in_a_row = int(state.get("filtered_out_in_a_row", 0))
