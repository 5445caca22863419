"""Figures from a Trainer's ``log_history``: the training curves and the collapse dashboard."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from starpo_trl.monitoring import keys  # noqa: E402


def series(log_history: list[dict], key: str) -> tuple[list[int], list[float]]:
    rows = [(row["step"], row[key]) for row in log_history if key in row and row[key] is not None]
    return [r[0] for r in rows], [float(r[1]) for r in rows]


def panel_lines(
    log_history: list[dict], panel_keys: Sequence[str], envs: Sequence[str]
) -> list[tuple[str, list[int], list[float]]]:
    """The lines a panel draws, as (label, steps, values): one per key, and for a per-env key (``{env}`` in it)
    one per training env. Labelled by the key's last part, with the env's name in front when there are several
    envs; keys never logged draw nothing."""
    lines = []
    for key in panel_keys:
        for env in envs if "{env}" in key else [None]:
            steps, values = series(log_history, key.format(env=env) if env else key)
            if steps:
                tail = key.split("/")[-1]
                label = tail if env is None or len(envs) == 1 else (env if len(panel_keys) == 1 else f"{env} {tail}")
                lines.append((label, steps, values))
    return lines


def _draw(ax, lines, label: str) -> None:
    for name, steps, values in lines:
        ax.plot(steps, values, marker=".", label=name)
    if len(lines) > 1:
        ax.legend(fontsize=7)
    ax.set_title(label)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)


def _env_list(envs: str | Sequence[str]) -> list[str]:
    return [envs] if isinstance(envs, str) else list(envs)


CURVE_PANELS = (
    ([keys.SUCCESS], "train success"),
    ([keys.FORMAT_ERROR_RATE], "format-error rate (per turn)"),
    ([keys.GROUP_REWARD_STD], "in-group reward std (mean)"),
    ([keys.ENTROPY], "policy entropy"),
)


def plot_curves(log_history: list[dict], envs: str | Sequence[str], path: str, title: str = "") -> str:
    """One PNG of the training curves: success, format errors and in-group reward std of each training env
    (``envs``: their metric names), and the policy entropy."""
    envs = _env_list(envs)
    fig, axes = plt.subplots(1, len(CURVE_PANELS), figsize=(4 * len(CURVE_PANELS), 3.2))
    for ax, (panel_keys, label) in zip(axes, CURVE_PANELS):
        _draw(ax, panel_lines(log_history, panel_keys, envs), label)
    fig.suptitle(title or ", ".join(envs))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


DASHBOARD_PANELS = (
    ("success", [keys.SUCCESS], "train success"),
    ("reward_std", [keys.GROUP_REWARD_STD], "in-group reward std (mean)"),
    ("entropy", [keys.ENTROPY], "policy entropy"),
    ("grad_norm", [keys.GRAD_NORM], "grad norm"),
    ("diversity", [keys.DISTINCT_2, keys.TEMPLATE_SHARE], "reasoning diversity"),
)
MI_PANEL = (
    "retrieval",
    [keys.RETRIEVAL_ACCURACY, keys.RETRIEVAL_CHANCE, keys.MI_ESTIMATE],
    "input dependence (MI pass)",
)


def dashboard_panels(log_history: list[dict]) -> tuple:
    """The dashboard's panels: the five above, and the MI pass's when the run logged it (`mi_metrics_every`)."""
    if any(keys.RETRIEVAL_ACCURACY in row for row in log_history):
        return (*DASHBOARD_PANELS, MI_PANEL)
    return DASHBOARD_PANELS


def env_names_from_history(log_history: list[dict]) -> list[str]:
    """The envs whose training success the history logs, in the order they first appear."""
    prefix, suffix = keys.SUCCESS.split("{env}")
    names = {}
    for row in log_history:
        for key in row:
            if key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix) + len(suffix):
                names.setdefault(key[len(prefix) : -len(suffix)])
    return list(names)


def plot_dashboard(
    log_history: list[dict],
    path: str,
    envs: str | Sequence[str] | None = None,
    events: list[dict] | None = None,
    title: str = "",
) -> str:
    """One PNG: success and in-group reward std of each training env (``envs``: their metric names; default:
    every env the history logs), entropy, grad norm, diversity and (when logged) the MI pass's retrieval
    accuracy against chance and I(X;Z); guard events as red lines."""
    envs = _env_list(envs) if envs else env_names_from_history(log_history) or ["env"]
    if events is None:
        events = [
            {"step": row["step"], "rules": str(row.get("guard/rules", "")).split(",")}
            for row in log_history
            if row.get("guard/warning")
        ]
    panels = dashboard_panels(log_history)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2))
    for ax, (_, panel_keys, label) in zip(axes, panels):
        _draw(ax, panel_lines(log_history, panel_keys, envs), label)
        for event in events:
            ax.axvline(event["step"], color="red", linestyle="--", alpha=0.7)
    if events:
        first = events[0]
        axes[0].annotate(
            f"guard: {', '.join(first['rules'])}",
            xy=(first["step"], 0.95),
            xycoords=("data", "axes fraction"),
            color="red",
            fontsize=7,
        )
    fig.suptitle(title or ", ".join(envs))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
