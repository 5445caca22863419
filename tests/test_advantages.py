import pytest
import torch

from starpo_trl.advantages import expand_groups, grpo_advantages, num_kept_groups, select_groups


def test_filter_keeps_exactly_the_largest_std_groups_by_hand():
    # 4 groups of 3; stds by hand: g0 [0,0,0] -> 0; g1 [0,1,2] -> 1; g2 [0,0,3] -> sqrt(3)=1.732; g3 [1,1,2] -> 0.577
    rewards = torch.tensor([0, 0, 0, 0, 1, 2, 0, 0, 3, 1, 1, 2], dtype=torch.float32)
    assert select_groups(rewards, 3, 0.5, "std").tolist() == [1, 2]
    assert select_groups(rewards, 3, 0.25, "std").tolist() == [2]
    assert select_groups(rewards, 3, 0.75, "std").tolist() == [1, 2, 3]
    assert select_groups(rewards, 3, 0.5, "std_rev").tolist() == [0, 3]
    assert select_groups(rewards, 3, 0.25, "none").tolist() == [0, 1, 2, 3]
    assert select_groups(rewards, 3, 1.0, "std").tolist() == [0, 1, 2, 3]
    assert expand_groups(torch.tensor([1, 3]), 3).tolist() == [3, 4, 5, 9, 10, 11]


def test_filter_ranks_raw_rewards_not_normalised_ones():
    # normalising each group would give both groups the same std (1); raw stds differ (0.1 vs 10)
    rewards = torch.tensor([0.0, 0.1, 0.2, 0.0, 10.0, 20.0])
    assert select_groups(rewards, 3, 0.5, "std").tolist() == [1]


def test_kept_group_count_and_bad_metric():
    assert num_kept_groups(8, 0.25) == 2 and num_kept_groups(8, 0.01) == 1 and num_kept_groups(8, 0.3) == 3
    with pytest.raises(ValueError, match="rollout_filter_metric"):
        select_groups(torch.zeros(6), 3, 0.5, "var")


def test_grpo_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 3.0, 3.0])
    # group 0: mean 1/3, std (unbiased) = sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.57735
    adv = grpo_advantages(rewards, 3, "group")
    expected0 = torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (0.5773502691896258 + 1e-4)
    assert torch.allclose(adv[:3], expected0, atol=1e-6)
    assert torch.equal(adv[3:], torch.zeros(3))  # zero-std group: no signal
    assert torch.allclose(grpo_advantages(rewards, 3, "none"), torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0]))
