"""``StepLog``: what a training step logs beyond TRL's own keys, and the state that carries between steps.

Each method returns metrics by their logged key (the trainer hands them to TRL's logger, which
averages each key over the logging interval). The state it keeps: the last rollout's reasoning
texts (the next step's echo-trap similarity; saved in checkpoints), the MI estimate's running level,
and what the rollout filter kept each step (``kept_groups``; ``train.py`` writes it to the report).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from starpo_trl.algorithms import group_std
from starpo_trl.algorithms.critic_targets import CriticTargets
from starpo_trl.algorithms.scoring import Scored
from starpo_trl.algorithms.value_model import explained_variance
from starpo_trl.monitoring.metrics import critic_metrics, rollout_metrics
from starpo_trl.monitoring.mi_statistics import ragen_zscore_ema
from starpo_trl.monitoring.mutual_info import EMANormalizer, mi_metrics
from starpo_trl.monitoring.settings import MISettings
from starpo_trl.rollout import Episode
from starpo_trl.rollout.settings import RolloutSettings

RAGEN_EMA_DECAY = 0.9  # RAGEN's ema_decay for the running std behind mi_zscore_ema


class StepLog:
    """Metrics of one run's steps. ``rollout`` / ``mi``: the run's episode and MI settings, ``group_size`` the
    rollouts per start state, ``env_name(episode)`` the name an episode's ``env/<name>/...`` metrics go under,
    ``shaping`` whether reasoning rewards are on (then their mean is logged); ``batch_size`` rows per forward
    pass of the MI metrics, ``seed`` the run's (the MI sample of a step is drawn from it)."""

    def __init__(
        self,
        rollout: RolloutSettings,
        mi: MISettings,
        group_size: int,
        env_name: Callable[[Episode], str],
        shaping: bool = False,
        batch_size: int = 8,
        seed: int = 0,
    ):
        self.episodes, self.mi = rollout, mi  # the run's episode settings and MI settings
        self.group_size, self.env_name, self.shaping = group_size, env_name, shaping
        self.batch_size, self.seed = batch_size, seed
        self.previous_thinks: list[str] | None = None
        self.kept_groups: list[dict] = []  # per training step: the groups kept, and every group's reward std
        self.mi_level = EMANormalizer()
        self.marginal_std_ema: dict[str, float] = {}  # RAGEN's running std of the mixture scores (decay 0.9)

    def rollout(self, episodes: list[Episode], scored: Scored, timings: dict[str, float]) -> dict[str, float]:
        """``rollout_metrics`` of the whole gathered batch; remembers its reasoning for the next step."""
        metrics, thinks = rollout_metrics(
            episodes,
            scored.rewards,
            self.group_size,
            len(scored.kept_groups),
            self.env_name,
            timings,
            self.episodes.enable_think,
            self.previous_thinks,
            self.shaping,
        )
        if self.episodes.enable_think:
            self.previous_thinks = thinks
        return metrics

    def record_kept_groups(self, scored: Scored) -> None:
        """What the filter kept this training step, and every group's reward std (-1 where undefined)."""
        stds = torch.nan_to_num(group_std(scored.rewards, self.group_size), nan=-1.0)
        self.kept_groups.append(
            {"kept": scored.kept_groups.tolist(), "group_std": [round(x, 6) for x in stds.tolist()]}
        )

    def critic(self, targets: CriticTargets, loss_mask: torch.Tensor) -> dict[str, float]:
        """The critic's explained variance and the mean / std of its advantages, returns and values."""
        explained = explained_variance(targets.values, targets.returns, targets.value_mask)
        metrics = critic_metrics(targets.advantages, targets.returns, targets.values, loss_mask)
        return {"critic/explained_variance": explained, **metrics}

    def mutual_information(
        self, model, episodes: list[Episode], tokenizer, temperature: float, step: int, accelerator=None
    ) -> dict[str, float]:
        """``collapse/*``: the MI metrics (``mutual_info.mi_metrics``, collective with several processes)
        on this process's ``episodes``, the seconds they took, ``mi_estimate_running_z`` (the MI estimate
        against its own running mean and std over steps) and RAGEN's ``mi_zscore_ema`` / ``mi_zscore_ema_seq``
        (the MI estimate per token / per reasoning over the running mean of ``marginal_std`` + 1e-3)."""
        mi = self.mi
        started = time.perf_counter()
        stats = mi_metrics(
            model,
            episodes,
            tokenizer,
            self.group_size,
            mi.mi_metrics_inputs,
            mi.mi_metrics_per_input,
            mi.mi_metrics_turn,
            self.batch_size,
            temperature,
            torch.Generator().manual_seed(self.seed * 7919 + step),
            accelerator,
            prefix=self.episodes.prefix_text(),
            shared_prefix=mi.mi_metrics_shared_prefix,
        )
        out = {"collapse/mi_seconds": time.perf_counter() - started}
        out.update({f"collapse/{key}": value for key, value in stats.items()})
        if "mi_estimate" in stats and math.isfinite(z := self.mi_level(stats["mi_estimate"])):
            out["collapse/mi_estimate_running_z"] = z
        for suffix, estimate, std in (
            ("", "mi_estimate_per_token", "marginal_std"),
            ("_seq", "mi_estimate", "marginal_std_seq"),
        ):
            if std in stats and estimate in stats:
                previous = self.marginal_std_ema.get(std)
                ema = (
                    stats[std] if previous is None else RAGEN_EMA_DECAY * previous + (1 - RAGEN_EMA_DECAY) * stats[std]
                )
                self.marginal_std_ema[std] = ema
                out[f"collapse/marginal_std_ema{suffix}"] = ema
                out[f"collapse/mi_zscore_ema{suffix}"] = ragen_zscore_ema(stats[estimate], ema)
        return out

    def state_dict(self) -> dict:
        return {"previous_thinks": self.previous_thinks}

    def load_state_dict(self, state: dict) -> None:
        if state.get("previous_thinks") is not None:
            self.previous_thinks = state["previous_thinks"]
