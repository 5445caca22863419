"""Figures from a Trainer's ``log_history``: the training curves and the collapse dashboard."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from starpo_trl.monitoring import keys  # noqa: E402


def series(log_history: list[dict], key: str) -> tuple[list[int], list[float]]:
    rows = [(row["step"], row[key]) for row in log_history if key in row and row[key] is not None]
    return [r[0] for r in rows], [float(r[1]) for r in rows]


def plot_curves(log_history: list[dict], env_name: str, path: str, title: str = "") -> str:
    panels = [
        (keys.SUCCESS.format(env=env_name), "train success"),
        (keys.FORMAT_ERROR_RATE.format(env=env_name), "format-error rate (per turn)"),
        (keys.GROUP_REWARD_STD.format(env=env_name), "in-group reward std (mean)"),
        (keys.ENTROPY, "policy entropy"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, (key, label) in zip(axes, panels):
        steps, values = series(log_history, key)
        ax.plot(steps, values, marker=".")
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(title or env_name)
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


def env_name_from_history(log_history: list[dict]) -> str | None:
    prefix, suffix = keys.SUCCESS.split("{env}")
    for row in log_history:
        for key in row:
            if key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix) + len(suffix):
                return key[len(prefix) : -len(suffix)]
    return None


def plot_dashboard(
    log_history: list[dict], path: str, env_name: str | None = None, events: list[dict] | None = None, title: str = ""
) -> str:
    """One PNG: success, in-group reward std, entropy, grad norm, diversity and (when logged) the MI pass's
    retrieval accuracy against chance and I(X;Z); guard events as red lines."""
    env_name = env_name or env_name_from_history(log_history) or "env"
    if events is None:
        events = [
            {"step": row["step"], "rules": str(row.get("guard/rules", "")).split(",")}
            for row in log_history
            if row.get("guard/warning")
        ]
    panels = dashboard_panels(log_history)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2))
    for ax, (_, panel_keys, label) in zip(axes, panels):
        for key in panel_keys:
            steps, values = series(log_history, key.format(env=env_name))
            if steps:
                ax.plot(steps, values, marker=".", label=key.split("/")[-1])
        for event in events:
            ax.axvline(event["step"], color="red", linestyle="--", alpha=0.7)
        if len(panel_keys) > 1:
            ax.legend(fontsize=7)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if events:
        first = events[0]
        axes[0].annotate(
            f"guard: {', '.join(first['rules'])}",
            xy=(first["step"], 0.95),
            xycoords=("data", "axes fraction"),
            color="red",
            fontsize=7,
        )
    fig.suptitle(title or env_name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
