"""``CollapseGuard``: watch the echo-trap signals during training and act before collapse.

The paper's finding: multi-turn RL collapses (the "echo trap"), and the collapse is announced by
the in-group reward std and the policy entropy falling, gradient-norm spikes, and reasoning that
all looks the same. ``CollapseMonitor`` is the pure rule engine (no trainer, tested on synthetic
streams); ``CollapseGuard`` is the Trainer callback that feeds it every log and acts:

- ``warn``: record the event (``guard/warning`` in the log history, ``guard_events.json``).
- ``stop``: also save the last healthy weights to ``OUTPUT_DIR/last-healthy`` and stop training.
- ``rollback``: also load the last healthy weights back into the model, save them there, stop.

Rules (each on a smoothed series; "early level" = mean of the first ``warmup_steps`` values):

- ``reward_std``: in-group reward std below ``reward_std_fraction`` x its early level; watched for
  each training env on its own (a run with several envs names the rule ``reward_std/<env name>``);
- ``entropy``: policy entropy below ``entropy_fraction`` x its early level;
- ``grad_norm``: a raw grad norm above ``grad_norm_spike`` x its running (smoothed) mean;
- ``diversity``: distinct-2 of the think texts below ``diversity_fraction`` x its early level or
  below the absolute ``diversity_floor`` (skipped on steps without any think text). Reasoning
  that was templated from the start (e.g. after SFT on templated demos) is not a collapse, so the
  absolute floor is off (0.0) by default;
- ``retrieval``: the share of sampled reasonings that their own input explains best
  (``collapse/retrieval_accuracy``, see ``starpo_trl.monitoring.mutual_info``; logged every
  ``mi_metrics_every`` steps) below ``retrieval_fraction`` x its early level, the mean of its first
  ``retrieval_warmup`` values: the reasoning stopped depending on the input, which entropy and
  reward std can miss.

A rule must hold ``patience`` logs in a row to warn. The guard warns once per rule and run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback

from starpo_trl.monitoring import keys
from starpo_trl.monitoring.settings import GUARD_ACTIONS, GuardSettings


@dataclass
class _Series:
    early: list[float] = field(default_factory=list)
    ema: float | None = None
    below: int = 0  # consecutive logs the rule held


class CollapseMonitor:
    """Pure rule engine. ``update(step, values)`` returns the rules that fire at this log.

    ``values`` maps a signal to its raw value at this log; missing or non-finite signals are skipped. A
    signal is one of ``SIGNALS`` or one of them with a qualifier (``reward_std/FrozenLake-v1``): the
    qualified series follows the rules of its kind, with its own early level, smoothing and patience.
    """

    SIGNALS = ("reward_std", "entropy", "grad_norm", "diversity", "retrieval")

    def __init__(self, rules: GuardSettings | None = None):
        self.rules = rules or GuardSettings()
        self.series = {name: _Series() for name in self.SIGNALS}
        self.fired: set[str] = set()

    @classmethod
    def kind(cls, name: str) -> str:
        """The rule a signal follows: its name up to the first ``/``."""
        kind = name.split("/", 1)[0]
        if kind not in cls.SIGNALS:
            raise ValueError(
                f"unknown guard signal {name!r}: give one of {cls.SIGNALS}, optionally as <signal>/<qualifier>"
            )
        return kind

    def _warmup(self, name: str) -> int:
        return (
            self.rules.collapse_guard_retrieval_warmup
            if self.kind(name) == "retrieval"
            else self.rules.collapse_guard_warmup_steps
        )

    def early_level(self, name: str) -> float | None:
        early = self.series[name].early
        return sum(early) / len(early) if len(early) >= self._warmup(name) else None

    def threshold(self, name: str) -> float | None:
        """The level a falling signal's smoothed series must drop below for its rule to hold: its fraction of
        the early level (``diversity``: or the absolute floor). None for ``grad_norm`` (a spike rule), before
        the early level is known, and where it is not positive."""
        r, early, kind = self.rules, self.early_level(name), self.kind(name)
        if kind == "grad_norm" or early is None:
            return None
        if kind == "diversity":
            return max(r.collapse_guard_diversity_floor, r.collapse_guard_diversity_fraction * early)
        fraction = {
            "reward_std": r.collapse_guard_reward_std_fraction,
            "retrieval": r.collapse_guard_retrieval_fraction,
        }.get(kind, r.collapse_guard_entropy_fraction)
        return fraction * early if early > 0 else None

    def _holds(self, name: str, value: float, previous_ema: float | None) -> bool:
        r, s = self.rules, self.series[name]
        if self.kind(name) == "grad_norm":  # a spike against the running mean of the values before it
            return (
                previous_ema is not None
                and len(s.early) >= r.collapse_guard_warmup_steps
                and value > r.collapse_guard_grad_norm_spike * previous_ema
            )
        threshold = self.threshold(name)
        return threshold is not None and s.ema < threshold

    def _order(self, values: dict[str, float]) -> list[str]:
        """The signals of this log in a fixed order: by kind as in ``SIGNALS``, then as given."""
        kinds = {name: self.SIGNALS.index(self.kind(name)) for name in values}
        return sorted(values, key=kinds.__getitem__)

    def update(self, step: int, values: dict[str, float]) -> list[str]:
        fired = []
        for name in self._order(values):
            value = values[name]
            if value is None or not math.isfinite(value):
                continue
            s = self.series.setdefault(name, _Series())
            previous = s.ema
            s.ema = (
                value
                if s.ema is None
                else self.rules.collapse_guard_smoothing * value + (1 - self.rules.collapse_guard_smoothing) * s.ema
            )
            if len(s.early) < self._warmup(name):
                s.early.append(value)
                continue
            s.below = s.below + 1 if self._holds(name, value, previous) else 0
            if self.kind(name) == "grad_norm" and s.below and previous is not None:
                s.ema = previous  # a spike does not raise the running mean it is judged against
            if s.below >= self.rules.collapse_guard_patience and name not in self.fired:
                self.fired.add(name)
                fired.append(name)
        return fired

    def healthy(self) -> bool:
        """No rule is currently holding (not even below patience)."""
        return all(s.below == 0 for s in self.series.values())

    def state(self) -> dict[str, dict]:
        return {n: {"ema": s.ema, "early": self.early_level(n)} for n, s in self.series.items()}


def signals_from_logs(logs: dict, envs: str | Sequence[str]) -> dict[str, float]:
    """The guard's signals from one Trainer log row. ``envs``: the training envs' metric names (the
    ``env/<name>/`` of their keys); with one env its in-group reward std is ``reward_std``, with several
    each env's is ``reward_std/<name>``."""
    envs = [envs] if isinstance(envs, str) else list(envs)
    if not envs:
        raise ValueError("signals_from_logs needs the training envs' metric names (at least one)")
    stds = {"reward_std": envs[0]} if len(envs) == 1 else {f"reward_std/{env}": env for env in envs}
    logged = {
        **{name: keys.GROUP_REWARD_STD.format(env=env) for name, env in stds.items()},
        "entropy": keys.ENTROPY,
        "grad_norm": keys.GRAD_NORM,
        "diversity": keys.DISTINCT_2,
        "retrieval": keys.RETRIEVAL_ACCURACY,
    }
    values = {name: float(logs[key]) for name, key in logged.items() if key in logs and logs[key] is not None}
    if not logs.get(keys.REASONING_RATE):  # no think text this step: diversity is undefined, not low
        values.pop("diversity", None)
    return values


class CollapseGuard(TrainerCallback):
    """Trainer callback around ``CollapseMonitor``; the trainer adds it when ``collapse_guard != 'off'``.

    It snapshots the trainable weights (and the critic's) on the CPU every ``snapshot_steps`` healthy
    logs; that snapshot is the "last healthy" state that ``stop`` saves and ``rollback`` restores.
    """

    def __init__(self, settings: GuardSettings, envs: Sequence[str], save_model=None, critic=None):
        """``settings``: the action (``collapse_guard``), the rules and the snapshot interval.
        ``envs``: the training envs' metric names, whose in-group reward std it watches (each on its own);
        ``save_model(path)`` writes the model (the trainer's ``save_model``; needed by ``stop`` and
        ``rollback``); ``critic`` (optional) is snapshotted with the policy. The policy itself, the
        run's output settings and its state come with every callback call."""
        action = settings.collapse_guard
        if action not in GUARD_ACTIONS:
            raise ValueError(f"collapse_guard must be one of {GUARD_ACTIONS}, got {action!r}")
        if action in ("stop", "rollback") and save_model is None:
            raise ValueError(f"collapse_guard={action!r} saves the last healthy weights: give save_model.")
        if isinstance(envs, str) or not envs:
            raise ValueError(
                f"CollapseGuard watches the training envs: give their metric names as a list, got {envs!r}"
            )
        self.action = action
        self.envs = list(envs)
        self.monitor = CollapseMonitor(settings)
        self.snapshot_steps = settings.collapse_guard_snapshot_steps
        self.save_model = save_model
        self.critic = critic
        self.snapshot: dict | None = None
        self.snapshot_step: int | None = None
        self.events: list[dict] = []

    # -- weights ---------------------------------------------------------------------------------
    def _parameters(self, model) -> list[tuple[str, torch.nn.Parameter]]:
        """The trained parameters: the policy's trainable ones and the critic's (head and body or adapter)."""
        params = [(f"policy.{n}", p) for n, p in model.named_parameters() if p.requires_grad]
        if self.critic is not None:
            params += [(f"critic.{i}", p) for i, p in enumerate(self.critic.trainable_parameters())]
        return params

    def _copy(self, model) -> dict[str, torch.Tensor]:
        return {n: p.detach().to("cpu", copy=True) for n, p in self._parameters(model)}

    def take_snapshot(self, model, step: int) -> None:
        self.snapshot = self._copy(model)
        self.snapshot_step = step

    @torch.no_grad()
    def restore_snapshot(self, model, weights: dict[str, torch.Tensor] | None = None) -> None:
        weights = self.snapshot if weights is None else weights
        for name, p in self._parameters(model):
            p.copy_(weights[name].to(p.device))

    def _save_last_healthy(self, model, output_dir: str) -> str:
        path = os.path.join(output_dir, "last-healthy")
        current = self._copy(model) if self.action == "stop" else None
        self.restore_snapshot(model)
        self.save_model(path)
        if current is not None:  # stop: save the snapshot, then put the current weights back
            self.restore_snapshot(model, current)
        return path

    # -- callback hooks --------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.action in ("stop", "rollback") and self.snapshot is None:
            self.take_snapshot(model, state.global_step)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs or "loss" not in logs and "grad_norm" not in logs:
            return control  # an evaluation or end-of-training log
        values = signals_from_logs(logs, self.envs)
        fired = self.monitor.update(state.global_step, values)
        if fired:
            event = {
                "step": state.global_step,
                "rules": fired,
                "values": values,
                "levels": self.monitor.state(),
                "action": self.action,
                "last_healthy_step": self.snapshot_step,
            }
            if self.action in ("stop", "rollback") and self.snapshot is not None:
                event["saved_to"] = self._save_last_healthy(model, args.output_dir)
                control.should_training_stop = True
            self.events.append(event)
            if state.log_history:
                state.log_history[-1]["guard/warning"] = 1.0
                state.log_history[-1]["guard/rules"] = ",".join(fired)
            self._write_events(args)
            rolled = " rolled back to step %s and" % self.snapshot_step if self.action == "rollback" else ""
            stopped = " stopped" if control.should_training_stop else " training goes on"
            print(
                f"[CollapseGuard] step {state.global_step}: {', '.join(fired)} fell/spiked past the threshold;{rolled}{stopped}."
            )
        elif (
            self.action in ("stop", "rollback")
            and self.monitor.healthy()
            and state.global_step % self.snapshot_steps == 0
        ):
            self.take_snapshot(model, state.global_step)
        return control

    def _write_events(self, args) -> None:
        if args.should_save:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, "guard_events.json"), "w") as f:
                json.dump(self.events, f, indent=2, default=float)


def build_guard(
    settings: GuardSettings, envs: Sequence[str], weights_sharded: bool, save_model, critic=None
) -> CollapseGuard | None:
    """The guard the settings ask for (None for ``collapse_guard='off'``), watching the training envs
    ``envs`` (their metric names). ``stop`` / ``rollback`` keep a copy of the weights, refused where
    ZeRO-3 shards them (``weights_sharded``)."""
    if settings.collapse_guard == "off":
        return None
    if settings.collapse_guard in ("stop", "rollback") and weights_sharded:
        raise ValueError(
            "collapse_guard='stop'/'rollback' keeps a copy of the weights, which ZeRO-3 shards: use "
            "collapse_guard='warn' or ZeRO-2."
        )
    return CollapseGuard(settings, envs, save_model=save_model, critic=critic)
