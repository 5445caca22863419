import math

import torch


def test_score_rollout_by_hand():
    """Groups of 2: [1, 0] (std 0.7071), [0.5, 0.5] (std 0), [NaN (failed), 1] -> the filter keeps the
    first group only; its GRPO advantages are +-0.5 / (0.7071 + 1e-4)."""
    from helpers import filter_settings

    from starpo_trl.algorithms.scoring import critic_turn_rewards, score_rollout

    args = filter_settings(
        env_error_policy="exclude",
        env_failure_reward=-1.0,
        rollout_filter_ratio=0.3,
        reward_normalization="identity",
        reward_norm_scope="group",
        advantage_estimator="grpo",
        use_turn_rewards=False,
    )
    failed = torch.tensor([False, False, False, False, True, False])
    scored = score_rollout([1.0, 0.0, 0.5, 0.5, 0.3, 1.0], failed, 2, args)
    assert torch.isnan(scored.rewards[4]) and scored.kept_groups.tolist() == [0] and scored.keep.tolist() == [0, 1]
    expected = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert torch.allclose(scored.advantages, torch.tensor([expected, -expected]), atol=1e-6)
    # failure_reward: the failed episode counts with -1.0, so group 2 ([-1, 1], std 1.414) ranks first
    args.env_error_policy = "failure_reward"
    assert score_rollout([1.0, 0.0, 0.5, 0.5, 0.3, 1.0], failed, 2, args).kept_groups.tolist() == [2]
    # a critic estimator leaves the advantages to the critic; its turn rewards: the episode's on the last turn
    args.advantage_estimator, args.env_error_policy = "gae", "exclude"
    scored = score_rollout([1.0, 0.0, 0.5, 0.5, 0.3, 1.0], failed, 2, args)
    assert scored.advantages is None
    assert critic_turn_rewards(
        [[0.2, 0.8], [0.0]], scored.rewards[scored.keep], scored.kept_rewards, slice(0, 2), 2, args
    ) == [[0.0, 1.0], [0.0]]
    args.use_turn_rewards = True  # identity normalisation: each turn's own reward
    assert critic_turn_rewards(
        [[0.25, 0.75], [0.0]], scored.rewards[scored.keep], scored.kept_rewards, slice(0, 2), 2, args
    ) == [[0.25, 0.75], [0.0]]
