"""Episode statistics: the per-step training metrics and the held-out success table."""

from __future__ import annotations

import numpy as np

from starpo_trl.rollout import Episode


def episode_metrics(episodes: list[Episode], group_size: int | None = None) -> dict[str, float]:
    """Success, action rates, turns and reward statistics over a list of episodes.

    With ``group_size`` (episodes grouped consecutively by start state) also pass@k over each group
    and in-group reward std (mean, max, fraction of groups with zero std).
    """
    if not episodes:
        return {}
    rewards = np.array([ep.reward for ep in episodes], dtype=float)
    actions = sum(ep.num_actions for ep in episodes)
    metrics = {
        "success": float(np.mean([ep.success for ep in episodes])),
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "turns": float(np.mean([ep.num_turns for ep in episodes])),
        "actions": float(np.mean([ep.num_actions for ep in episodes])),
        "valid_action_rate": sum(ep.num_valid_actions for ep in episodes) / actions if actions else 0.0,
        "effective_action_rate": sum(ep.num_effective_actions for ep in episodes) / actions if actions else 0.0,
        "format_error_rate": sum(ep.num_format_errors for ep in episodes) / max(1, sum(ep.num_turns for ep in episodes)),
        "truncated": float(np.mean([ep.truncated for ep in episodes])),
        "env_errors": float(sum(ep.env_error is not None for ep in episodes)),
    }
    if group_size and len(episodes) % group_size == 0 and group_size > 1:
        grouped = rewards.reshape(-1, group_size)
        stds = grouped.std(axis=1, ddof=1)
        success = np.array([ep.success for ep in episodes]).reshape(-1, group_size)
        metrics.update(
            {
                f"pass@{group_size}": float(success.any(axis=1).mean()),
                "group_reward_std_mean": float(stds.mean()),
                "group_reward_std_max": float(stds.max()),
                "frac_zero_std_groups": float(np.isclose(stds, 0.0).mean()),
            }
        )
    return metrics
