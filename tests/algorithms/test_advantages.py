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


def test_rloo_by_hand():
    """Groups of 3: [1, 0, 0] -> 1 - 0, 0 - 0.5, 0 - 0.5; [1, NaN (failed), 0] -> 1 - 0, 0 (left out), 0 - 1."""
    from starpo_trl.algorithms.advantages import rloo_advantages

    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, float("nan"), 0.0]), 3)
    assert torch.allclose(adv, torch.tensor([1.0, -0.5, -0.5, 1.0, 0.0, -1.0]))


def test_reinforce_pp_gives_locked_mirrored_groups_a_gradient_where_grpo_gives_none():
    """Two mirrored start states answered the same way in both (rewards [1, 1] and [0, 0]) and a third
    group [1, 0]: GRPO gives the two agreeing groups exactly 0; the batch-mean baseline (mean 0.5,
    unbiased std over the six rewards sqrt(1.5 / 5)) gives them +-0.5 / (std + 1e-4)."""
    from helpers import filter_settings

    from starpo_trl.algorithms.advantages import batch_mean_advantages
    from starpo_trl.algorithms.scoring import score_rollout

    rewards = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    args = filter_settings(
        env_error_policy="exclude",
        env_failure_reward=0.0,
        rollout_filter_ratio=1.0,
        reward_normalization="identity",
        reward_norm_scope="group",
        advantage_estimator="grpo",
        use_turn_rewards=False,
    )
    failed = torch.zeros(6, dtype=torch.bool)
    grpo = score_rollout(rewards, failed, 2, args, scale_rewards="batch").advantages
    assert grpo[:4].tolist() == [0.0, 0.0, 0.0, 0.0] and grpo[4] > 0
    args.advantage_estimator = "reinforce_pp"
    scored = score_rollout(rewards, failed, 2, args, scale_rewards="batch")
    a = 0.5 / (math.sqrt(1.5 / 5) + 1e-4)
    assert torch.allclose(scored.advantages, torch.tensor([a, a, -a, -a, a, -a]), atol=1e-6)
    assert torch.allclose(
        score_rollout(rewards, failed, 2, args, scale_rewards="none").advantages,
        torch.tensor([0.5, 0.5, -0.5, -0.5, 0.5, -0.5]),
    )
    # a failed episode is out of the mean and std and gets 0: [1, NaN, 0] -> mean 0.5, std sqrt(0.5)
    adv = batch_mean_advantages(torch.tensor([1.0, float("nan"), 0.0]), "batch")
    b = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert torch.allclose(adv, torch.tensor([b, 0.0, -b]), atol=1e-6)
    # a batch whose rewards all agree gives exactly 0, not rounding noise
    assert batch_mean_advantages(torch.full((4,), 2.4146361351013184), "batch").tolist() == [0.0] * 4
    # a filter that kept nothing leaves an empty batch: no advantages, no error (the step is then skipped as empty)
    assert batch_mean_advantages(torch.tensor([]), "batch").numel() == 0


def test_reinforce_pp_refuses_per_group_scaling_before_any_model_loads():
    import pytest

    from starpo_trl import StarPOConfig

    with pytest.raises(ValueError, match="scale_rewards to 'batch' or 'none'"):
        StarPOConfig(
            output_dir="/tmp/x",
            env_id="starpo/Bandit-v0",
            advantage_estimator="reinforce_pp",
            scale_rewards="group",
            use_cpu=True,
        )
    args = StarPOConfig(
        output_dir="/tmp/x",
        env_id="starpo/Bandit-v0",
        advantage_estimator="reinforce_pp",
        scale_rewards="batch",
        use_cpu=True,
    )
    assert args.advantage_estimator == "reinforce_pp"
