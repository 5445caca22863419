import math

import pytest
import torch

from starpo_trl.algorithms import between_group_share, expand_groups, grpo_advantages, num_kept_groups, select_groups


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


# -- turn-aware credit ------------------------------------------------------------------------------
from starpo_trl.algorithms import (  # noqa: E402
    bilevel_gae,
    masked_gae,
    normalize_rewards,
    place_rewards,
    reward_normalization_terms,
    rloo_advantages,
    whiten,
)


def test_masked_gae_skips_env_tokens_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 9.0, 9.0, 0.8, 9.0]])  # 9.0 on env tokens must never be used
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])
    adv, ret = masked_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=4: 1 - 0.8 = 0.2; t=1: 0.9*0.8 - 0.6 + 0.72*0.2 = 0.264; t=0: 0.9*0.6 - 0.5 + 0.72*0.264 = 0.23008
    assert torch.allclose(adv, torch.tensor([[0.23008, 0.264, 0.0, 0.0, 0.2, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.73008, 0.864, 0.0, 0.0, 1.0, 0.0]]), atol=1e-6)


def test_masked_gae_gamma_lambda_one_is_return_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    values = torch.arange(1, 11, dtype=torch.float32)[None] / 10
    adv, _ = masked_gae(rewards, values, torch.ones_like(values), 1.0, 1.0)
    expected = torch.tensor([[2.0] * 5 + [1.0] * 5]) - values
    assert torch.allclose(adv, expected, atol=1e-6)


def test_bilevel_gae_by_hand():
    # rewards [0,0,0,0,1,0,0,0,0,1]: two turns ending at tokens 4 and 9, values 0.1..1.0
    values = torch.arange(1, 11, dtype=torch.float32)[None] / 10
    mask = torch.ones_like(values)
    adv, ret = bilevel_gae([[1.0, 1.0]], [[4, 9]], values, mask, gamma=1.0, lam=1.0, turn_gamma=0.95)
    # turn 2: A = 1 - 1.0 = 0, G = 1.0; turn 1: A = 1 + 0.95 * 1.0 - 0.5 = 1.45, G = 1.95
    expected = torch.tensor([[1.85, 1.75, 1.65, 1.55, 1.45, 0.4, 0.3, 0.2, 0.1, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[1.95] * 5 + [1.0] * 5]), atol=1e-6)
    turn_adv, _ = bilevel_gae([[1.0, 1.0]], [[4, 9]], values, mask, 1.0, 1.0, 0.95, turn_level_only=True)
    assert torch.allclose(turn_adv, torch.tensor([[1.45] * 5 + [0.0] * 5]), atol=1e-6)


def test_bilevel_gae_zero_reward_middle_turn_and_env_tokens():
    # three turns, the middle one pays 0; env tokens (mask 0) between turns carry junk values
    values = torch.tensor([[0.2, 0.4, 9.0, 0.3, 0.5, 9.0, 0.6, 0.8]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 0, 1, 1]])
    adv, ret = bilevel_gae([[1.0, 0.0, 2.0]], [[1, 4, 7]], values, mask, gamma=1.0, lam=1.0, turn_gamma=0.5)
    # turn 3: A3 = 2 - 0.8 = 1.2, G3 = 2.0; turn 2: A2 = 0 + 0.5*0.8 - 0.5 + 0.5*1.2 = 0.5, G2 = 1.0
    # turn 1: A1 = 1 + 0.5*0.5 - 0.4 + 0.5*0.5 = 1.1, G1 = 1.5
    expected = torch.tensor([[1.3, 1.1, 0.0, 0.7, 0.5, 0.0, 1.4, 1.2]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[1.5, 1.5, 0.0, 1.0, 1.0, 0.0, 2.0, 2.0]]), atol=1e-6)


def test_bilevel_gae_one_turn_and_all_masked_padding_rows():
    values = torch.tensor([[0.5, 0.25, 0.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    adv, ret = bilevel_gae([[1.0], []], [[1], []], values, mask, 1.0, 1.0, 0.95)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.75, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(ret[1], torch.zeros(3))
    gae_adv, gae_ret = masked_gae(
        place_rewards((2, 3), [[1.0], []], [[1], []], per_turn=False), values, mask, 1.0, 1.0
    )
    assert torch.allclose(gae_adv, adv) and torch.equal(gae_ret[1], torch.zeros(3))


def test_place_rewards_per_turn_or_at_the_end():
    per_turn = place_rewards((1, 6), [[0.5, 0.0, 1.0]], [[1, 3, 5]], per_turn=True)
    assert per_turn.tolist() == [[0.0, 0.5, 0.0, 0.0, 0.0, 1.0]]
    at_end = place_rewards((1, 6), [[0.5, 0.0, 1.0]], [[1, 3, 5]], per_turn=False)
    assert at_end.tolist() == [[0.0, 0.0, 0.0, 0.0, 0.0, 1.5]]


def test_rloo_and_reward_normalisation_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 3.0, 3.0])
    # 1 - (0+0)/2 = 1; 0 - (1+0)/2 = -0.5
    assert torch.allclose(rloo_advantages(rewards, 3), torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, 0.0]))
    assert torch.allclose(normalize_rewards(rewards, 3, "mean"), torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0]))
    assert torch.equal(normalize_rewards(rewards, 3, "identity"), rewards)
    batch = normalize_rewards(torch.tensor([0.0, 10.0]), 2, "asym_clip", scope="batch", clip=0.5)
    assert batch.tolist() == [-0.5, pytest.approx(10 / 2 / (50**0.5 + 1e-6))]


def test_between_group_share_by_hand():
    # groups [1, 1, 0] and [0, 0, 0]: means 2/3 and 0, grand mean 1/3
    # MSB = 3 * 2 * (1/3)^2 / 1 = 2/3; MSW = (2 * (1/3)^2 + (2/3)^2 + 0) / (2 * 2) = 1/6
    # between = (2/3 - 1/6) / 3 = 1/6; share = (1/6) / (1/6 + 1/6) = 1/2
    assert between_group_share(torch.tensor([1.0, 1, 0, 0, 0, 0]), 3) == pytest.approx(0.5)
    # all the variance between groups / all within groups (the group means' spread is only noise)
    assert between_group_share(torch.tensor([1.0, 1, 0, 0]), 2) == pytest.approx(1.0)
    assert between_group_share(torch.tensor([1.0, 0, 1, 0]), 2) == 0.0
    # groups [1, 0, 0] and [1, 1, 0]: MSB = 1/6 < MSW = 1/3, so the estimate clamps to 0
    assert between_group_share(torch.tensor([1.0, 0, 0, 1, 1, 0]), 3) == 0.0
    # a group with a failed (NaN) episode is left out; one group left, or no variance: NaN
    assert between_group_share(torch.tensor([1.0, 1, 0, 0, float("nan"), 1]), 2) == pytest.approx(1.0)
    assert math.isnan(between_group_share(torch.tensor([1.0, float("nan"), 0, 1]), 2))
    assert math.isnan(between_group_share(torch.ones(6), 3))


def test_bilevel_gae_last_token_of_a_turn_carries_the_turn_advantage_for_any_gamma():
    # a perfect critic (values = the returns it should predict) gets zero advantages, also with gamma < 1
    values = torch.tensor([[0.5, 1.0]])
    adv, ret = bilevel_gae([[1.0]], [[1]], values, torch.ones(1, 2), gamma=0.5, lam=1.0, turn_gamma=1.0)
    assert adv.tolist() == [[0.0, 0.0]] and ret.tolist() == [[0.5, 1.0]]
    # two turns, gamma 0.5, lam 0.5, turn_gamma 0.9, by hand. Turn ends at 1 and 3 (values 0.4, 0.2):
    # A2 = 2 - 0.2 = 1.8, G2 = 2.0; A1 = 1 + 0.9 * 0.2 - 0.4 + 0.9 * 0.5 * 1.8 = 1.59, G1 = 1.99
    # turn 1: t=1: 1.99 - 0.4 = 1.59; t=0: 0.5 * 0.4 - 0.3 + 0.25 * 1.59 = 0.2975
    # turn 2: t=3: 2.0 - 0.2 = 1.8;   t=2: 0.5 * 0.2 - 0.1 + 0.25 * 1.8 = 0.45
    values = torch.tensor([[0.3, 0.4, 0.1, 0.2]])
    adv, ret = bilevel_gae([[1.0, 2.0]], [[1, 3]], values, torch.ones(1, 4), gamma=0.5, lam=0.5, turn_gamma=0.9)
    assert torch.allclose(adv, torch.tensor([[0.2975, 1.59, 0.45, 1.8]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.5975, 1.99, 0.55, 2.0]]), atol=1e-6)


@pytest.mark.parametrize("method", ["mean", "mean_std", "asym_clip"])
@pytest.mark.parametrize("scope", ["group", "batch"])
def test_a_group_whose_rewards_are_all_equal_normalises_to_exact_zeros(method, scope):
    same = torch.full((16,), 2.4146361351013184)  # its float32 mean differs from it in the last bit
    assert torch.equal(normalize_rewards(same, 16, method, scope), torch.zeros(16))
    shift, scale = reward_normalization_terms(same, 16, method, scope)
    assert torch.isinf(scale).all()  # so every turn reward r_turn / scale is exactly 0 too
    # a failed (NaN) episode stays NaN, the rest of a constant group is 0
    with_nan = same.clone()
    with_nan[3] = float("nan")
    out = normalize_rewards(with_nan, 16, method, scope)
    assert math.isnan(out[3]) and torch.equal(out[torch.arange(16) != 3], torch.zeros(15))
    # a group that does vary is normalised as before
    mixed = torch.cat([same, torch.tensor([0.0, 1.0, 0.0, 1.0])])
    if scope == "group":
        assert torch.equal(normalize_rewards(mixed, 4, method, scope)[:16], torch.zeros(16))
    assert normalize_rewards(mixed, 4, method, scope)[16:].abs().sum() > 0


def test_grpo_advantages_of_a_constant_group_are_exact_zeros():
    same = torch.full((16,), 2.4146361351013184)
    for scale in ("group", "batch", "none"):
        assert torch.equal(grpo_advantages(same, 16, scale), torch.zeros(16))


def test_masked_whitening_by_hand_and_across_processes():
    x = torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # mean 2, unbiased var 1 -> [-1, 0, 1] on model tokens, 0 elsewhere
    assert torch.allclose(whiten(x, m), torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), atol=1e-6)
    # two processes: each whitens its rows with the totals over both, as one process holding both
    total = (3.0, 6.0, 14.0)
    assert torch.allclose(whiten(x[:1], m[:1], total), torch.tensor([[-1.0, 0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(whiten(x[1:], m[1:], total), torch.tensor([[1.0, 0.0, 0.0]]), atol=1e-6)
    assert torch.equal(whiten(x, torch.zeros_like(m)), torch.zeros_like(x))


def test_score_rollout_by_hand():
    """Groups of 2: [1, 0] (std 0.7071), [0.5, 0.5] (std 0), [NaN (failed), 1] -> the filter keeps the
    first group only; its GRPO advantages are +-0.5 / (0.7071 + 1e-4)."""
    from types import SimpleNamespace

    from starpo_trl.algorithms.scoring import critic_turn_rewards, score_rollout

    args = SimpleNamespace(
        env_error_policy="exclude",
        env_failure_reward=-1.0,
        rollout_filter_ratio=0.3,
        rollout_filter_metric="std",
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
