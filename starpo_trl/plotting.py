"""Training curves from a Trainer's ``log_history``: success, in-group reward std, entropy."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(log_history: list[dict], key: str) -> tuple[list[int], list[float]]:
    rows = [(row["step"], row[key]) for row in log_history if key in row and row[key] is not None]
    return [r[0] for r in rows], [float(r[1]) for r in rows]


def plot_curves(log_history: list[dict], env_name: str, path: str, title: str = "") -> str:
    panels = [
        (f"env/{env_name}/success", "train success"),
        (f"env/{env_name}/group_reward_std_mean", "in-group reward std (mean)"),
        ("entropy", "policy entropy"),
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
