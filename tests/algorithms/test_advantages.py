import math

import pytest
import torch
from helpers import filter_settings

from starpo_trl.algorithms import (
    between_group_share,
    bilevel_gae,
    expand_groups,
    grpo_advantages,
    masked_gae,
    normalize_rewards,
    num_kept_groups,
    place_rewards,
    reward_normalization_terms,
    rloo_advantages,
    whiten,
)
from starpo_trl.algorithms.advantages import batch_mean_advantages, turn_end_mask
from starpo_trl.algorithms.scoring import filter_groups


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


# -- restored hand-worked tests (lost in 5f00d2a's rewrite), adapted to today's API ----------------------------------
# The filter tests went through `select_groups(rewards, G, ratio, metric)`, which returned the kept groups' sorted
# indices; today that is `filter_groups(rewards, G, settings)` (scores by `group_scores`, keeps by `select_groups`).


def _kept(rewards, group_size, ratio, metric):
    settings = filter_settings(rollout_filter_ratio=ratio, rollout_filter_metric=metric)
    return filter_groups(rewards, group_size, settings).tolist()


def test_filter_keeps_exactly_the_largest_std_groups_by_hand():
    # 4 groups of 3; stds by hand: g0 [0,0,0] -> 0; g1 [0,1,2] -> 1; g2 [0,0,3] -> sqrt(3)=1.732; g3 [1,1,2] -> 0.577
    rewards = torch.tensor([0, 0, 0, 0, 1, 2, 0, 0, 3, 1, 1, 2], dtype=torch.float32)
    assert _kept(rewards, 3, 0.5, "std") == [1, 2]
    assert _kept(rewards, 3, 0.25, "std") == [2]
    assert _kept(rewards, 3, 0.75, "std") == [1, 2, 3]
    assert _kept(rewards, 3, 0.5, "std_rev") == [0, 3]
    assert _kept(rewards, 3, 0.25, "none") == [0, 1, 2, 3]
    assert _kept(rewards, 3, 1.0, "std") == [0, 1, 2, 3]
    assert expand_groups(torch.tensor([1, 3]), 3).tolist() == [3, 4, 5, 9, 10, 11]


def test_filter_ranks_raw_rewards_not_normalised_ones():
    # normalising each group would give both groups the same std (1); raw stds differ (0.1 vs 10)
    rewards = torch.tensor([0.0, 0.1, 0.2, 0.0, 10.0, 20.0])
    assert _kept(rewards, 3, 0.5, "std") == [1]


def test_kept_group_count_and_bad_metric():
    assert num_kept_groups(8, 0.25) == 2 and num_kept_groups(8, 0.01) == 1 and num_kept_groups(8, 0.3) == 3
    with pytest.raises(ValueError, match="rollout_filter_metric"):
        _kept(torch.zeros(6), 3, 0.5, "var")


def test_grpo_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 3.0, 3.0])
    # group 0: mean 1/3, std (unbiased) = sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.57735
    adv = grpo_advantages(rewards, 3, "group")
    expected0 = torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (0.5773502691896258 + 1e-4)
    assert torch.allclose(adv[:3], expected0, atol=1e-6)
    assert torch.equal(adv[3:], torch.zeros(3))  # zero-std group: no signal
    assert torch.allclose(grpo_advantages(rewards, 3, "none"), torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0]))


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


# -- hand-worked tests where injected bugs used to pass --------------------------------------------------------------
def test_bilevel_gae_turn_gamma_and_turn_lambda_differ_from_gamma_and_lambda():
    """Two turns (ends 1 and 4, an env token between carrying a junk value), gamma 0.5, lam 0.8, turn_gamma 0.9,
    turn_lambda 0.6: every one of the four discounts is used in its own place, so a swap changes a number.
    Turn level (values at the turn ends 0.4, 0.2; rewards 1, 2):
      A2 = 2 - 0.2 = 1.8, G2 = 2.0;  A1 = 1 + 0.9 * 0.2 - 0.4 + 0.9 * 0.6 * 1.8 = 0.78 + 0.972 = 1.752, G1 = 2.152
    Token level: t=1: G1 - 0.4 = 1.752; t=0: 0.5 * 0.4 - 0.3 + 0.5 * 0.8 * 1.752 = 0.6008
                 t=4: G2 - 0.2 = 1.8;   t=3: 0.5 * 0.2 - 0.1 + 0.5 * 0.8 * 1.8 = 0.72"""
    values = torch.tensor([[0.3, 0.4, 9.0, 0.1, 0.2]])
    mask = torch.tensor([[1, 1, 0, 1, 1]])
    adv, ret = bilevel_gae([[1.0, 2.0]], [[1, 4]], values, mask, 0.5, 0.8, turn_gamma=0.9, turn_lambda=0.6)
    assert torch.allclose(adv, torch.tensor([[0.6008, 1.752, 0.0, 0.72, 1.8]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.9008, 2.152, 0.0, 0.82, 2.0]]), atol=1e-6)
    # turn GAE (turn_level_only): every model token of a turn gets that turn's advantage and return
    adv, ret = bilevel_gae([[1.0, 2.0]], [[1, 4]], values, mask, 0.5, 0.8, 0.9, 0.6, turn_level_only=True)
    assert torch.allclose(adv, torch.tensor([[1.752, 1.752, 0.0, 1.8, 1.8]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[2.152, 2.152, 0.0, 2.0, 2.0]]), atol=1e-6)
    # turn_lambda defaults to lam: A1 = 0.78 + 0.9 * 0.8 * 1.8 = 2.076
    adv, _ = bilevel_gae([[1.0, 2.0]], [[1, 4]], values, mask, 0.5, 0.8, turn_gamma=0.9, turn_level_only=True)
    assert adv[0, 0].item() == pytest.approx(2.076)


def test_masked_gae_with_env_tokens_in_the_middle_against_a_loop_over_model_tokens_only():
    """Random rewards and values, env tokens in runs in the middle, gamma 0.9 and lam 0.7: equal to GAE run
    by a plain loop over the model tokens alone (the env tokens cut out first)."""
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.rand(3, 9, generator=g), torch.rand(3, 9, generator=g)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 1], [1, 0, 1, 0, 1, 0, 1, 0, 1], [0, 1, 1, 1, 0, 0, 1, 1, 0]])
    rewards = rewards * mask  # rewards sit on model tokens
    adv, ret = masked_gae(rewards, values, mask, gamma=0.9, lam=0.7)
    for b in range(3):
        idx = [t for t in range(9) if mask[b, t]]
        r, v = [float(rewards[b, t]) for t in idx], [float(values[b, t]) for t in idx]
        expected, running = [0.0] * len(idx), 0.0
        for k in reversed(range(len(idx))):
            next_v = v[k + 1] if k + 1 < len(idx) else 0.0
            running = r[k] + 0.9 * next_v - v[k] + 0.9 * 0.7 * running
            expected[k] = running
        full = torch.zeros(9)
        full[idx] = torch.tensor(expected)
        assert torch.allclose(adv[b], full, atol=1e-6)
        assert torch.allclose(ret[b], (full + values[b]) * mask[b], atol=1e-6)


# rewards [1, 0, 0 | 3, 1, 2] in groups of 3, by hand:
#   group 0: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3); group 1: mean 2, std 1
#   batch: mean 7/6, unbiased std sqrt((1 + 49 + 49 + 121 + 1 + 25) / 36 / 5) = sqrt(41/30)
R = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0, 2.0], dtype=torch.float64)
GROUP_MEAN = torch.tensor([1 / 3] * 3 + [2.0] * 3, dtype=torch.float64)
GROUP_STD = torch.tensor([math.sqrt(1 / 3)] * 3 + [1.0] * 3, dtype=torch.float64)
BATCH_MEAN, BATCH_STD = 7 / 6, math.sqrt(41 / 30)


@pytest.mark.parametrize("scope", ["group", "batch"])
@pytest.mark.parametrize("method", ["identity", "mean", "mean_std", "asym_clip"])
def test_reward_normalisation_each_method_and_scope_by_hand(method, scope):
    mean = GROUP_MEAN if scope == "group" else torch.full((6,), BATCH_MEAN, dtype=torch.float64)
    std = GROUP_STD if scope == "group" else torch.full((6,), BATCH_STD, dtype=torch.float64)
    want_shift = {"identity": torch.zeros(6, dtype=torch.float64)}.get(method, mean)
    want_scale = {"identity": 1.0, "mean": 1.0}.get(method, std + 1e-6)
    shift, scale = reward_normalization_terms(R, 3, method, scope)
    assert torch.allclose(shift, want_shift, atol=1e-12)
    assert torch.allclose(scale, torch.as_tensor(want_scale, dtype=torch.float64).expand(6), atol=1e-12)
    normalized = (R - want_shift) / want_scale
    if method == "asym_clip":
        normalized = normalized.clamp(-0.5, 1.5)  # clip 0.5: [-clip, 3 * clip]
    assert torch.allclose(normalize_rewards(R, 3, method, scope, clip=0.5), normalized, atol=1e-12)


def test_asym_clip_cuts_losses_at_clip_and_wins_at_three_times_clip():
    # batch scope, clip 0.5: (0 - 7/6) / sqrt(41/30) = -0.998 -> -0.5; (3 - 7/6) / sqrt(41/30) = 1.568 -> 1.5
    out = normalize_rewards(R, 3, "asym_clip", "batch", clip=0.5)
    kept = (2 - 7 / 6) / (math.sqrt(41 / 30) + 1e-6)
    assert out.tolist() == pytest.approx(
        [(1 - 7 / 6) / (math.sqrt(41 / 30) + 1e-6), -0.5, -0.5, 1.5, out[0].item(), kept]
    )
    # group scope, clip 0.5: group 0 -> (2/3) / sqrt(1/3) = 1.1547 stays, -0.577 -> -0.5; group 1 -> 1.0, -1 -> -0.5, 0
    out = normalize_rewards(R, 3, "asym_clip", "group", clip=0.5)
    s0 = math.sqrt(1 / 3) + 1e-6
    assert out.tolist() == pytest.approx([(2 / 3) / s0, -0.5, -0.5, 1 / (1 + 1e-6), -0.5, 0.0])


def test_estimators_leave_failed_and_lone_episodes_at_zero_and_name_bad_settings():
    nan = float("nan")
    # scale "none": a failed episode (NaN) gets exactly 0, not NaN or 1
    assert grpo_advantages(torch.tensor([1.0, nan, 0.0]), 3, "none").tolist() == [0.5, 0.0, -0.5]
    # RLOO: the only valid episode of its group has no others to compare with: 0
    assert rloo_advantages(torch.tensor([nan, 2.0, 1.0, 0.0]), 2).tolist() == [0.0, 0.0, 1.0, -1.0]
    # the batch-mean baseline of a single episode: 0
    assert batch_mean_advantages(torch.tensor([3.0]), "batch").tolist() == [0.0]
    with pytest.raises(ValueError, match="scale_rewards must be 'group', 'batch' or 'none', got 'x'"):
        grpo_advantages(torch.zeros(2), 2, "x")
    with pytest.raises(ValueError, match="scales over the batch: scale_rewards must be 'batch' or 'none'"):
        batch_mean_advantages(torch.zeros(2), "group")
    with pytest.raises(ValueError, match="reward_normalization must be identity, mean, mean_std or asym_clip"):
        normalize_rewards(torch.zeros(2), 2, "z")


def test_normalisation_defaults_are_identity_per_group_and_clip_one():
    # defaults: identity normalisation, per group; asym_clip clips at [-1, 3] unless told
    assert torch.equal(normalize_rewards(R, 3), R)
    shift, scale = reward_normalization_terms(R, 3)
    assert shift.tolist() == [0.0] * 6 and scale.tolist() == [1.0] * 6
    assert torch.allclose(reward_normalization_terms(R, 3, "mean")[0], GROUP_MEAN)  # scope defaults to group
    wide = torch.tensor([0.0] * 9 + [100.0], dtype=torch.float64)  # (100 - 10) / std(= 31.62) = 2.846; -0.316
    assert normalize_rewards(wide, 10, "asym_clip").tolist() == pytest.approx(
        [-10 / math.sqrt(1000)] * 9 + [90 / math.sqrt(1000)], abs=1e-4
    )
    wider = torch.tensor([0.0] * 15 + [100.0], dtype=torch.float64)  # 93.75 / 25 = 3.75 -> 3 (3 * clip)
    assert normalize_rewards(wider, 16, "asym_clip")[-1].item() == 3.0


def test_rows_without_turns_before_other_rows_are_skipped_not_the_end():
    # an empty row (a failed episode, or padding) first: the rows after it still get their rewards / advantages
    placed = place_rewards((2, 3), [[], [1.0, 2.0]], [[], [0, 2]], per_turn=True)
    assert placed.tolist() == [[0.0, 0.0, 0.0], [1.0, 0.0, 2.0]]
    values = torch.tensor([[0.0, 0.0], [0.25, 0.5]])
    adv, ret = bilevel_gae([[], [1.0]], [[], [1]], values, torch.tensor([[0, 0], [1, 1]]), 1.0, 1.0, 1.0)
    assert adv.tolist() == [[0.0, 0.0], [0.75, 0.5]] and ret.tolist() == [[0.0, 0.0], [1.0, 1.0]]


def test_advantages_are_float32_whatever_the_critics_dtype():
    """A bfloat16 critic's values must not make GAE accumulate in bfloat16 (1 + 1/256 rounds to 1 there)."""
    values = torch.tensor([[0.5, 0.25, 0.125]], dtype=torch.bfloat16)
    rewards = torch.tensor([[0.0, 0.0, 1.0 + 1 / 256]])
    adv, ret = masked_gae(rewards, values, torch.ones(1, 3), 1.0, 1.0)
    assert adv.dtype == torch.float32 and adv[0, 2].item() == pytest.approx(1 + 1 / 256 - 0.125)
    adv, ret = bilevel_gae([[1.0 + 1 / 256]], [[2]], values, torch.ones(1, 3), 1.0, 1.0, 1.0)
    assert adv.dtype == ret.dtype == torch.float32 and ret[0, 0].item() == pytest.approx(1 + 1 / 256)


def test_between_group_share_with_three_groups_and_a_total_of_one():
    # groups [1, 1], [0, 0], [0, 1]: means 1, 0, 0.5 (grand 0.5); MSB = 2 * (0.25 + 0.25 + 0) / 2 = 0.5;
    # MSW = (0 + 0 + 0.5) / (3 * 1) = 1/6; between = (0.5 - 1/6) / 2 = 1/6; share = (1/6) / (1/6 + 1/6) = 0.5
    assert between_group_share(torch.tensor([1.0, 1, 0, 0, 0, 1]), 2) == pytest.approx(0.5)
    # groups [0, 2] and [1, 1]: equal means (MSB 0), MSW = (2 + 0) / 2 = 1: the share is 0, not undefined
    assert between_group_share(torch.tensor([0.0, 2, 1, 1]), 2) == 0.0


def test_whitening_two_tokens_a_small_spread_and_a_constant():
    m = torch.ones(1, 2)
    # [1, 3]: mean 2, unbiased var 2 -> -+1/sqrt(2)
    assert whiten(torch.tensor([[1.0, 3.0]]), m)[0].tolist() == pytest.approx([-(0.5**0.5), 0.5**0.5], abs=1e-6)
    # [1, 1.5]: mean 1.25, var 0.125 -> -+0.25 / sqrt(0.125) = -+0.7071 (a small variance is not floored)
    assert whiten(torch.tensor([[1.0, 1.5]]), m)[0].tolist() == pytest.approx([-(0.5**0.5), 0.5**0.5], abs=1e-5)
    # [2, 2, 2]: no spread -> exact zeros (eps keeps the division defined)
    assert whiten(torch.full((1, 3), 2.0), torch.ones(1, 3)).tolist() == [[0.0, 0.0, 0.0]]
    # a single token: nothing to whiten against
    assert whiten(torch.tensor([[5.0, 7.0]]), torch.tensor([[1, 0]])).tolist() == [[0.0, 0.0]]


def test_critic_turn_rewards_normalised_per_turn_or_on_the_last_turn_by_hand():
    """Kept batch [1, 0 | 3, 1] in groups of 2, mean_std per group: group 1 has mean 2 and std sqrt(2). Its two
    episodes (rows 2:4) played turns [1, 2] and [0.5, 0.5]: each turn divided by the scale, the mean taken off
    the last, so the turns add up to the normalised episode reward ((3 - 2) / sqrt 2 and (1 - 2) / sqrt 2)."""
    from starpo_trl.algorithms.scoring import critic_turn_rewards

    raw = torch.tensor([1.0, 0.0, 3.0, 1.0])
    normalized = normalize_rewards(raw, 2, "mean_std")
    args = filter_settings(use_turn_rewards=True, reward_normalization="mean_std", reward_norm_scope="group")
    c = math.sqrt(2) + 1e-6
    got = critic_turn_rewards([[1.0, 2.0], [0.5, 0.5], []], raw, normalized, slice(2, 4), 2, args)
    assert got[0] == pytest.approx([1 / c, 0.0]) and got[1] == pytest.approx([0.5 / c, -1.5 / c]) and len(got) == 2
    assert sum(got[0]) == pytest.approx(float(normalized[2])) and sum(got[1]) == pytest.approx(float(normalized[3]))
    assert critic_turn_rewards([[1.0, 2.0], []], raw, normalized, slice(2, 4), 2, args)[1] == []
    args.use_turn_rewards = False  # the normalised episode reward on the last turn
    got = critic_turn_rewards([[1.0, 2.0], [0.5, 0.5]], raw, normalized, slice(2, 4), 2, args)
    assert got == [[0.0, pytest.approx(1 / c)], [0.0, pytest.approx(-1 / c)]]
    assert critic_turn_rewards([[], [1.0]], raw, normalized, slice(0, 2), 2, args) == [
        [],
        [pytest.approx(-0.5 / (math.sqrt(0.5) + 1e-6))],
    ]


def test_score_rollout_feeds_the_filter_its_metric_and_normalises_the_kept_groups():
    from starpo_trl.algorithms.scoring import score_rollout

    rewards = [1.0, 0.0, 3.0, 1.0, 0.5, 0.5]
    failed = torch.zeros(6, dtype=torch.bool)
    base = dict(env_error_policy="exclude", env_failure_reward=0.0, reward_norm_scope="group", use_turn_rewards=False)
    # by length: group 2 (lengths 9, 9) is the longest, then group 0
    args = filter_settings(
        **base,
        rollout_filter_ratio=0.5,
        rollout_filter_metric="length",
        reward_normalization="mean_std",
        advantage_estimator="grpo",
    )
    scored = score_rollout(rewards, failed, 2, args, lengths=[5, 5, 1, 1, 9, 9])
    assert scored.kept_groups.tolist() == [0, 2] and scored.rewards.dtype == torch.float32
    # kept rewards normalised per group of 2: [1, 0] -> +-0.5 / (sqrt(0.5) + 1e-6); [0.5, 0.5] -> 0
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert scored.kept_rewards.tolist() == pytest.approx([s, -s, 0.0, 0.0])
    # by entropy: group 1 (entropies 4, 6) ranks first
    args.rollout_filter_metric, args.rollout_filter_ratio = "entropy", 0.25
    assert score_rollout(rewards, failed, 2, args, entropies=[1.0, 1.0, 4.0, 6.0, 2.0, 2.0]).kept_groups.tolist() == [
        1
    ]
    # per env: groups 0, 1 in env 0 and group 2 in env 1; one group each
    args.rollout_filter_metric, args.rollout_filter_ratio, args.rollout_filter_scope = "std", 0.5, "per_env"
    assert score_rollout(rewards, failed, 2, args, group_env=[0, 0, 1]).kept_groups.tolist() == [1, 2]
    # two processes: kept rows must divide between them (2 groups of 2 rows: they do)
    assert score_rollout(rewards, failed, 2, args, num_processes=2, group_env=[0, 0, 1]).keep.tolist() == [2, 3, 4, 5]


def test_reward_functions_add_to_the_last_turn_of_played_episodes():
    from starpo_trl.algorithms.scoring import add_function_rewards, env_reward
    from starpo_trl.rollout.engine import Episode, StartState

    def episode(seed, turns, error=None):
        msgs = [{"role": "user", "content": f"s{seed}"}, {"role": "assistant", "content": f"a{seed}"}]
        return Episode(
            StartState("starpo/Bandit-v0", seed),
            [1],
            turn_rewards=list(turns),
            env_error=error,
            messages=msgs,
            success=seed == 1,
        )

    played, failed, never = episode(1, [0.5, 1.0]), episode(2, [0.2], error="step: boom"), episode(3, [])
    seen = {}

    def bonus(prompts, completions, env_id, seed, success, env_reward):
        seen.update(
            prompts=prompts, completions=completions, env_id=env_id, seed=seed, success=success, env_reward=env_reward
        )
        return [0.25]

    def nothing(prompts, completions, **kw):
        return [None]

    assert add_function_rewards([played, failed, never], [bonus, nothing]) == {"bonus": 0.25, "nothing": 0.0}
    assert played.turn_rewards == [0.5, 1.25] and failed.turn_rewards == [0.2] and never.turn_rewards == []
    assert seen == {
        "prompts": [[{"role": "user", "content": "s1"}]],
        "completions": [[{"role": "assistant", "content": "a1"}]],
        "env_id": ["starpo/Bandit-v0"],
        "seed": [1],
        "success": [True],
        "env_reward": [1.5],
    }
    assert add_function_rewards([failed, never], [bonus]) == {}
    with pytest.raises(ValueError, match="reward function bonus returned 2 rewards for 1 episodes"):
        add_function_rewards([played], [_named(lambda **kw: [1.0, 2.0], "bonus")])
    assert env_reward(["x", "y"], [1, 0.5]) == [1.0, 0.5] and all(type(r) is float for r in env_reward([], [True]))


def test_a_nan_reward_is_an_env_error_and_a_raising_function_is_named_or_marked():
    """Reward functions are treated as env rewards are (#45, item 5): a NaN or inf ends that episode as an env
    error; a function that raises stops training naming it, or with on_error='mark' ends its episodes as errors."""
    import math

    from starpo_trl.algorithms.scoring import RewardFunctionError, add_function_rewards
    from starpo_trl.rollout.engine import Episode, StartState

    def episodes():
        msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        return [Episode(StartState("starpo/Bandit-v0", s), [1], turn_rewards=[1.0], messages=msgs) for s in range(3)]

    eps = episodes()
    means = add_function_rewards(eps, [_named(lambda **kw: [0.5, math.nan, math.inf], "shaky")])
    assert means == {"shaky": 0.5}  # over the episodes it scored with a number
    assert [ep.turn_rewards for ep in eps] == [[1.5], [1.0], [1.0]]
    assert [ep.env_error for ep in eps] == [
        None,
        "reward_func shaky: non-finite reward nan",
        "reward_func shaky: non-finite reward inf",
    ]
    # a later function sees only the episodes still standing
    seen = []
    add_function_rewards(eps, [_named(lambda seed, **kw: seen.append(seed) or [0.0] * len(seed), "later")])
    assert seen == [[0]]

    def broken(**kw):
        raise KeyError("score")

    message = (
        r"^reward function 'broken' failed on 3 episodes: KeyError: 'score'\. Fix it, or set reward_func_errors='mark' "
        r"to end the episodes of such a call as env errors and train on\.$"
    )
    with pytest.raises(RewardFunctionError, match=message):
        add_function_rewards(episodes(), [broken])
    marked = episodes()
    assert add_function_rewards(marked, [broken, _named(lambda **kw: [1.0] * 3, "ok")], on_error="mark") == {}
    assert [ep.env_error for ep in marked] == ["reward_func broken: KeyError: 'score'"] * 3
    assert [ep.turn_rewards for ep in marked] == [[1.0]] * 3
    assert all(ep.done for ep in marked)

    # a callable without __name__ is named by its type; an error message is kept to 500 characters
    class Scorer:
        def __call__(self, **kw):
            raise RuntimeError("x" * 1000)

    long = episodes()
    add_function_rewards(long, [Scorer()], on_error="mark")
    assert long[0].env_error.startswith("reward_func Scorer: RuntimeError: xxx") and len(long[0].env_error) == 500
    with pytest.raises(RewardFunctionError, match="^reward function 'Scorer' failed"):
        add_function_rewards(episodes(), [Scorer()])
    flagged = episodes()
    add_function_rewards(flagged, [_named(lambda **kw: [math.nan, 1.0, 1.0], "nan_first")])
    assert flagged[0].done and not flagged[1].done  # the NaN ends that episode only
    with pytest.raises(RewardFunctionError, match="returned 'a lot'|could not convert"):
        add_function_rewards(episodes(), [_named(lambda **kw: ["a lot"] * 3, "wordy")])
    with pytest.raises(ValueError, match="on_error must be one of"):
        add_function_rewards(episodes(), [], on_error="ignore")


def _named(fn, name):
    fn.__name__ = name
    return fn


def test_defaults_turn_ends_at_the_edges_and_a_constant_group_with_a_failed_episode():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0, 2.0])
    assert torch.equal(grpo_advantages(rewards, 3), grpo_advantages(rewards, 3, "group"))  # scale defaults to group
    assert torch.equal(batch_mean_advantages(rewards), batch_mean_advantages(rewards, "batch"))
    # a turn ending at the first completion token counts; a position past the row is ignored
    mask = torch.tensor([[1, 1, 1]])
    assert turn_end_mask([[0, 2, 3]], mask).tolist() == [[1, 0, 1]]
    # 16 equal rewards and a failed episode: its float32 mean differs from the value in the last bit, yet the
    # group is constant and its advantages are exact zeros (the failed one too)
    same = torch.full((17,), 2.4146361351013184)
    same[5] = float("nan")
    assert torch.equal(grpo_advantages(same, 17, "none"), torch.zeros(17))


def test_reward_functions_add_to_the_last_of_three_turns_and_average_over_episodes():
    from starpo_trl.algorithms.scoring import add_function_rewards
    from starpo_trl.rollout.engine import Episode, StartState

    eps = [
        Episode(
            StartState("starpo/Bandit-v0", s),
            [1],
            turn_rewards=[0.0, 0.0, 1.0],
            messages=[{"role": "user", "content": "x"}],
        )
        for s in range(2)
    ]
    assert add_function_rewards(eps, [_named(lambda **kw: [1.0, 3.0], "f")]) == {"f": 2.0}
    assert [ep.turn_rewards for ep in eps] == [[0.0, 0.0, 2.0], [0.0, 0.0, 4.0]]


def test_scoring_with_batch_scope_a_larger_eps_odd_row_counts_and_integer_rewards():
    from starpo_trl.algorithms.scoring import critic_turn_rewards, filter_groups, score_rollout

    base = dict(env_error_policy="exclude", env_failure_reward=0.0, use_turn_rewards=True, advantage_estimator="grpo")
    args = filter_settings(**base, rollout_filter_ratio=1.0, reward_normalization="mean", reward_norm_scope="batch")
    # batch scope: the kept batch's mean (1.5) comes off, not each group's
    scored = score_rollout([1.0, 0.0, 3.0, 2.0], torch.zeros(4, dtype=torch.bool), 2, args)
    assert scored.kept_rewards.tolist() == [-0.5, -1.5, 1.5, 0.5]
    raw = torch.tensor([1.0, 0.0, 3.0, 2.0])
    assert critic_turn_rewards([[0.5, 0.5], [0.0]], raw, scored.kept_rewards, slice(0, 2), 2, args) == [
        [0.5, -1.0],
        [-1.5],
    ]
    # three groups of one episode: three rows, kept whole on one process (the default)
    one = filter_settings(**base, rollout_filter_ratio=1.0, reward_normalization="identity", reward_norm_scope="group")
    assert score_rollout([1.0, 0.0, 2.0], torch.zeros(3, dtype=torch.bool), 1, one).keep.tolist() == [0, 1, 2]
    # rewards given as integers are still floats here (a failed one becomes NaN)
    scored = score_rollout([1, 0, 1, 1], torch.tensor([False, False, False, True]), 2, one)
    assert scored.rewards.dtype == torch.float32 and math.isnan(scored.rewards[3])
    # eps: top_p 0.9 linear over variances 4/3 and 1/3 (sum 5/3): threshold 1.5 - eps; eps 0.01 (1.49) needs both
    # groups (4/3 = 1.33 < 1.49), eps 0.3 (1.2) the first alone
    top_p = dict(rollout_filter_strategy="top_p", rollout_filter_ratio=0.9, rollout_filter_metric="variance")
    r = torch.tensor([0.0, 2.0, 0.0, 2.0, 1.0, 2.0, 1.0, 2.0])  # group 0: var 4/3, group 1: var 1/3
    assert filter_groups(r, 4, filter_settings(**top_p, rollout_filter_eps=0.01)).tolist() == [0, 1]
    assert filter_groups(r, 4, filter_settings(**top_p, rollout_filter_eps=0.3)).tolist() == [0]


def test_per_env_ranking_puts_failed_groups_last_and_follows_smallest():
    from starpo_trl.algorithms.scoring import filter_groups

    nan = float("nan")
    # env 0: group 0 std 0.707, group 1 all failed (NaN); env 1: group 2 std 0, group 3 std 1.414
    r = torch.tensor([0.0, 1.0, nan, nan, 1.0, 1.0, 0.0, 2.0])
    per_env = filter_settings(rollout_filter_ratio=1.0, rollout_filter_scope="per_env")
    # 4 groups of 2 rows on 3 processes: 8 rows -> 6; the lowest-ranked goes: the failed group, after the zero one
    assert filter_groups(r, 2, per_env, num_processes=3, group_env=[0, 0, 1, 1]).tolist() == [0, 2, 3]
    r = torch.tensor([0.0, 1.0, 0.0, 3.0, 1.0, 1.0, 0.0, 2.0])  # stds 0.707, 2.12 | 0, 1.414
    smallest = filter_settings(
        rollout_filter_ratio=0.5, rollout_filter_scope="per_env", rollout_filter_type="smallest"
    )
    assert filter_groups(r, 2, smallest, group_env=[0, 0, 1, 1]).tolist() == [0, 2]  # the smaller std of each env
    # all four kept, 8 rows on 3 processes: the lowest-ranked under "smallest", the largest std (group 1), goes
    smallest.rollout_filter_ratio = 1.0
    assert filter_groups(r, 2, smallest, num_processes=3, group_env=[0, 0, 1, 1]).tolist() == [0, 2, 3]
