"""Episode statistics (starpo_trl/monitoring/metrics.py): failed episodes are counted, not averaged in."""

import math

import pytest
import torch

from starpo_trl.monitoring.metrics import episode_metrics, rollout_metrics
from starpo_trl.rollout.engine import Episode, StartState


def episode(seed, turns, error=None, success=False):
    return Episode(
        StartState("starpo/Sokoban-v0", seed), [1], turn_rewards=list(turns), env_error=error, success=success
    )


def test_failed_episodes_are_left_out_of_the_reward_statistics():
    """Two played episodes at -0.3 and two that failed at reset (no turns, reward 0): the reward mean is -0.3,
    not -0.15 (#45, item 10); the failures are counted in env_errors and as not solved."""
    eps = [episode(0, [-0.3]), episode(1, [-0.1, -0.2]), episode(2, [], "reset: boom"), episode(3, [], "reset: boom")]
    m = episode_metrics(eps)
    assert m["reward_mean"] == pytest.approx(-0.3) and m["reward_std"] == pytest.approx(0.0, abs=1e-12)
    assert m["env_errors"] == 2.0 and m["success"] == 0.0
    # groups of 2: (1.0, 0.0) has std 0.7071 (ddof 1); (0.5, failed) has one played episode and is left out
    grouped = [episode(0, [1.0], success=True), episode(0, [0.0]), episode(1, [0.5]), episode(1, [0.2], "step: x")]
    g = episode_metrics(grouped, group_size=2)
    assert g["reward_mean"] == pytest.approx(0.5) and g["reward_std"] == pytest.approx(math.sqrt(1 / 6))
    assert (
        g["group_reward_std_mean"] == pytest.approx(math.sqrt(0.5))
        and g["group_reward_std_max"] == g["group_reward_std_mean"]
    )
    assert g["frac_zero_std_groups"] == 0.0 and g["pass@2"] == 0.5
    # nothing played: no reward statistic at all (not 0, not NaN)
    none = episode_metrics([episode(0, [], "reset: boom"), episode(0, [], "reset: boom")], group_size=2)
    assert "reward_mean" not in none and "group_reward_std_mean" not in none and none["env_errors"] == 2.0


def test_the_logged_per_env_reward_mean_leaves_failed_resets_out():
    eps = [episode(0, [-0.3]), episode(0, [-0.3]), episode(1, [], "reset: boom"), episode(1, [], "reset: boom")]
    rewards = torch.tensor([-0.3, -0.3, float("nan"), float("nan")])
    timings = {"generate": 0.0, "env": 0.0}
    out, _ = rollout_metrics(eps, rewards, 2, 1, "Sokoban-v0", timings, think=False)
    assert out["env/Sokoban-v0/reward_mean"] == pytest.approx(-0.3) and out["env/errors"] == 2.0
    assert out["reward"] == pytest.approx(-0.3)
