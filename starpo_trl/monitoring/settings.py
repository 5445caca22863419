"""The monitoring wing's settings: the collapse guard (``GuardSettings``) and the mutual-information collapse
metrics (``MISettings``). ``StarPOConfig`` is composed from them (the same flat names in recipes and on the
command line); the guard and the MI pass read them."""

from __future__ import annotations

from dataclasses import dataclass, field

from starpo_trl.numeric_settings import Range, check_declared
from starpo_trl.settings_base import Settings

GUARD_ACTIONS = ("off", "warn", "stop", "rollback")


@dataclass
class GuardSettings(Settings):
    r"""
    The collapse guard (see `starpo_trl.monitoring.guard`).

    Parameters:
        collapse_guard (`str`, `"warn"`): `off`, `warn` (log the event), `stop` (also save the last
            healthy weights to `output_dir/last-healthy` and stop) or `rollback` (also load them back
            into the model, then stop).
        collapse_guard_warmup_steps (`int`, 10): logs that define each signal's early level.
        collapse_guard_smoothing (`float`, 0.3): EMA weight of the newest value.
        collapse_guard_reward_std_fraction (`float`, 0.4) / collapse_guard_entropy_fraction (`float`,
            0.4): warn when the smoothed in-group reward std / entropy falls below this fraction of
            its early level.
        collapse_guard_grad_norm_spike (`float`, 5.0): warn when a grad norm exceeds this many times
            its running mean.
        collapse_guard_diversity_fraction (`float`, 0.5) / collapse_guard_diversity_floor (`float`,
            0.0: off): warn when smoothed distinct-2 of the think texts falls below this fraction of
            its early level, or below this absolute floor.
        collapse_guard_retrieval_fraction (`float`, 0.5) / collapse_guard_retrieval_warmup (`int`, 3):
            warn when the smoothed retrieval accuracy of the MI metrics falls below this fraction of
            the mean of its first values (needs `mi_metrics_every`).
        collapse_guard_patience (`int`, 2): logs in a row a rule must hold.
        collapse_guard_snapshot_steps (`int`, 5): with `stop`/`rollback`, keep a CPU copy of the
            trained weights every this many healthy steps (the "last healthy" state).
    """

    collapse_guard: str = field(default="warn", metadata={"help": "off, warn, stop or rollback."})
    collapse_guard_warmup_steps: int = field(
        default=10, metadata={"help": "Logs that define each signal's early level."}
    )
    collapse_guard_smoothing: float = field(default=0.3, metadata={"help": "EMA weight of the newest value."})
    collapse_guard_reward_std_fraction: float = field(
        default=0.4, metadata={"help": "Warn below this fraction of the early in-group reward std."}
    )
    collapse_guard_entropy_fraction: float = field(
        default=0.4, metadata={"help": "Warn below this fraction of the early entropy."}
    )
    collapse_guard_grad_norm_spike: float = field(
        default=5.0, metadata={"help": "Warn when grad norm exceeds this many times its running mean."}
    )
    collapse_guard_diversity_fraction: float = field(
        default=0.5, metadata={"help": "Warn below this fraction of the early distinct-2 of think texts."}
    )
    collapse_guard_diversity_floor: float = field(
        default=0.0, metadata={"help": "Warn when smoothed distinct-2 of think texts falls below (0: off)."}
    )
    collapse_guard_retrieval_fraction: float = field(
        default=0.5, metadata={"help": "Warn below this fraction of the early MI retrieval accuracy."}
    )
    collapse_guard_retrieval_warmup: int = field(
        default=3, metadata={"help": "MI logs that define the retrieval accuracy's early level."}
    )
    collapse_guard_patience: int = field(default=2, metadata={"help": "Logs in a row a rule must hold to warn."})
    collapse_guard_snapshot_steps: int = field(
        default=5, metadata={"help": "Healthy steps between CPU snapshots (stop/rollback)."}
    )

    def check_guard(self) -> None:
        """The rules among these settings (ranges: ``GUARD_RANGES``)."""
        if self.collapse_guard not in GUARD_ACTIONS:
            raise ValueError(f"collapse_guard must be one of {GUARD_ACTIONS}, got {self.collapse_guard!r}")
        for name in ("collapse_guard_warmup_steps", "collapse_guard_patience", "collapse_guard_snapshot_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 < self.collapse_guard_smoothing <= 1.0:
            raise ValueError(f"collapse_guard_smoothing must be in (0, 1], got {self.collapse_guard_smoothing}")


@dataclass
class MISettings(Settings):
    r"""
    The mutual-information collapse metrics (see `starpo_trl.monitoring.mutual_info`).

    Parameters:
        mi_metrics_every (`int`, 10): every this many steps, `collapse/mi_estimate`,
            `collapse/conditional_entropy`, `collapse/reasoning_entropy`, `collapse/retrieval_accuracy` and
            `collapse/mi_zscore` on `mi_metrics_inputs` start states x `mi_metrics_per_input` reasonings of
            the rollout (`mi_metrics_turn`: each episode's `first` turn or a `uniform` one); 0 turns them off.
        mi_metrics_shared_prefix (`bool`, True): the MI pass reads each input once and scores every
            reasoning under it from a copy of its key-value cache (about `Nz` times cheaper than reading
            each input + reasoning whole, which `False` does: for a model whose cache cannot be extended).
    """

    mi_metrics_every: int = field(
        default=10, metadata={"help": "Mutual-information collapse metrics every this many steps (0: off)."}
    )
    mi_metrics_turn: str = field(default="first", metadata={"help": "MI pairs from the first turn or a uniform one."})
    mi_metrics_inputs: int = field(default=8, metadata={"help": "Start states (inputs) in the MI sample."})
    mi_metrics_per_input: int = field(default=2, metadata={"help": "Reasonings per input in the MI sample."})
    mi_metrics_shared_prefix: bool = field(
        default=True, metadata={"help": "MI pass reads each input once and reuses its KV cache for every reasoning."}
    )

    def check_mi(self) -> None:
        """The rules among these settings (ranges: ``MI_RANGES``)."""
        if self.mi_metrics_turn not in ("first", "uniform"):
            raise ValueError(f"mi_metrics_turn must be 'first' or 'uniform', got {self.mi_metrics_turn!r}")
        if self.mi_metrics_every < 0:
            raise ValueError(f"mi_metrics_every must be >= 0 (0: off), got {self.mi_metrics_every}")
        for name in ("mi_metrics_inputs", "mi_metrics_per_input"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


GUARD_RANGES = {
    **dict.fromkeys(
        (
            "collapse_guard_warmup_steps",
            "collapse_guard_retrieval_warmup",
            "collapse_guard_patience",
            "collapse_guard_snapshot_steps",
        ),
        Range(1),
    ),
    "collapse_guard_grad_norm_spike": Range(0),
    **dict.fromkeys(
        (
            "collapse_guard_reward_std_fraction",
            "collapse_guard_entropy_fraction",
            "collapse_guard_diversity_fraction",
            "collapse_guard_diversity_floor",
            "collapse_guard_retrieval_fraction",
        ),
        Range(0, 1),
    ),
    "collapse_guard_smoothing": Range(0, 1, low_open=True),
}
MI_RANGES = {"mi_metrics_every": Range(0), **dict.fromkeys(("mi_metrics_inputs", "mi_metrics_per_input"), Range(1))}
check_declared(GuardSettings, GUARD_RANGES)
check_declared(MISettings, MI_RANGES)
