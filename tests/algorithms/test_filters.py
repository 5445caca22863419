"""The rollout filter: group scores and every strategy, checked against numbers worked out by hand."""

import math

import pytest
import torch
from helpers import filter_settings

from starpo_trl.algorithms import expand_groups, num_kept_groups
from starpo_trl.algorithms.filters import group_scores, select_groups
from starpo_trl.algorithms.scoring import filter_groups
from starpo_trl.rollout.batch import episode_filter_values, padded_rows
from starpo_trl.rollout.engine import Episode, StartState

# 4 groups of 3; unbiased stds by hand: g0 [0,0,0] -> 0; g1 [0,1,2] -> 1; g2 [0,0,3] -> sqrt(3); g3 [1,1,2] -> sqrt(1/3)
REWARDS = torch.tensor([0, 0, 0, 0, 1, 2, 0, 0, 3, 1, 1, 2], dtype=torch.float32)
# variances: 0, 1, 3, 1/3 (sum 13/3); means: 0, 1, 1, 4/3


def test_group_scores_by_hand():
    std = group_scores(REWARDS, 3, "std")
    assert std.tolist() == pytest.approx([0.0, 1.0, math.sqrt(3), math.sqrt(1 / 3)])
    assert std[0].item() == 0.0  # a constant group is exactly zero
    assert group_scores(REWARDS, 3, "variance").tolist() == pytest.approx([0.0, 1.0, 3.0, 1 / 3])
    # RAGEN's reward_variance is the in-group std (its code: rm_scores.std(dim=-1)), bit for bit our std
    assert torch.equal(group_scores(REWARDS, 3, "reward_variance"), std)
    assert group_scores(REWARDS, 3, "mean").tolist() == pytest.approx([0.0, 1.0, 1.0, 4 / 3])
    lengths = torch.tensor([10, 20, 30, 1, 1, 1, 5, 5, 5, 0, 0, 9], dtype=torch.float32)
    assert group_scores(REWARDS, 3, "length", lengths=lengths).tolist() == pytest.approx([20, 1, 5, 3])
    # a failed episode (NaN) is left out of every statistic; a group of failed episodes scores NaN
    failed = torch.tensor([0.0, 1.0, float("nan"), float("nan"), float("nan"), float("nan")])
    assert group_scores(failed, 3, "std")[0].item() == pytest.approx(math.sqrt(0.5))
    assert math.isnan(group_scores(failed, 3, "std")[1].item())
    assert group_scores(failed, 3, "length", lengths=torch.arange(6.0))[0].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs the episodes' entropy"):
        group_scores(REWARDS, 3, "entropy")
    with pytest.raises(ValueError, match="rollout_filter_metric"):
        group_scores(REWARDS, 3, "var")


def test_top_k_keeps_the_ceil_share_best_first():
    std = group_scores(REWARDS, 3, "std")
    assert select_groups(std, "top_k", 0.5).tolist() == [2, 1]
    assert select_groups(std, "top_k", 0.25).tolist() == [2]
    assert select_groups(std, "top_k", 0.3).tolist() == [2, 1]  # ceil(1.2) = 2
    assert select_groups(std, "top_k", 0.75).tolist() == [2, 1, 3]
    assert select_groups(std, "top_k", 1.0).tolist() == [2, 1, 3, 0]
    assert select_groups(std, "top_k", 0.5, largest=False).tolist() == [0, 3]
    # include_zero=False: the zero group is never kept, even when the share asks for it
    assert select_groups(std, "top_k", 1.0, include_zero=False).tolist() == [2, 1, 3]
    assert select_groups(std, "top_k", 0.5, include_zero=False, largest=False).tolist() == [3, 1]
    assert select_groups(std, "top_k_abs", 3).tolist() == [2, 1, 3]
    assert select_groups(std, "top_k_abs", 9).tolist() == [2, 1, 3, 0]
    assert num_kept_groups(8, 0.25) == 2 and num_kept_groups(8, 0.01) == 1 and num_kept_groups(8, 0.3) == 3
    assert expand_groups(torch.tensor([1, 3]), 3).tolist() == [3, 4, 5, 9, 10, 11]


def test_ties_keep_the_earlier_group_and_failed_groups_rank_last():
    scores = torch.tensor([1.0, float("nan"), 2.0, 1.0, 0.0])
    assert select_groups(scores, "top_k", 0.6).tolist() == [2, 0, 3]
    assert select_groups(scores, "top_k", 1.0).tolist() == [2, 0, 3, 4, 1]  # a fixed count: NaN fills, last
    assert select_groups(scores, "top_k", 1.0, largest=False).tolist() == [4, 0, 3, 2, 1]
    assert select_groups(scores, "top_p", 1.0).tolist() == [2, 0, 3, 4]  # top_p drops a failed group
    assert select_groups(scores, "min_p", 0.5).tolist() == [2, 0, 3]


def test_top_p_linear_by_hand():
    var = group_scores(REWARDS, 3, "variance")  # 0, 1, 3, 1/3: sorted 3, 1, 1/3, 0; sum 13/3
    # threshold 0.9 * 13/3 - 0.01 = 3.89: 3 < 3.89, 3 + 1 = 4 >= 3.89 -> two groups
    assert select_groups(var, "top_p", 0.9, include_zero=False).tolist() == [2, 1]
    # 0.95 * 13/3 - 0.01 = 4.107: needs the third (4 + 1/3 = 4.33)
    assert select_groups(var, "top_p", 0.95, include_zero=False).tolist() == [2, 1, 3]
    # 0.6 * 13/3 - 0.01 = 2.59: the first alone (3) reaches it
    assert select_groups(var, "top_p", 0.6, include_zero=False).tolist() == [2]
    # eps: 0.93 * 13/3 = 4.03; with eps 0.01 (4.02) it needs a third group, with eps 0.1 (3.93) it does not
    assert select_groups(var, "top_p", 0.93, include_zero=False).tolist() == [2, 1, 3]
    assert select_groups(var, "top_p", 0.93, include_zero=False, eps=0.1).tolist() == [2, 1]
    # top_p >= 1 keeps every candidate: with include_zero the zero group too (RAGEN's "no filter")
    assert select_groups(var, "top_p", 1.0).tolist() == [2, 1, 3, 0]
    assert select_groups(var, "top_p", 1.0, include_zero=False).tolist() == [2, 1, 3]
    # a near-zero batch: threshold 0.9 * 0.005 - 0.01 < 0 -> nothing kept (the step is skipped)
    assert select_groups(torch.tensor([0.004, 0.001, 0.0]), "top_p", 0.9).tolist() == []
    assert select_groups(torch.zeros(4), "top_p", 0.9, include_zero=False).tolist() == []
    with pytest.raises(ValueError, match="non-negative"):
        select_groups(torch.tensor([1.0, -0.5]), "top_p", 0.9)
    with pytest.raises(ValueError, match="use largest"):
        select_groups(var, "top_p", 0.9, largest=False)


def test_top_p_softmax_and_min_p_by_hand():
    scores = torch.tensor([0.0, math.log(2), math.log(5), math.log(1)])  # softmax over all: 1, 2, 5, 1 / 9
    # best first: 5/9 = 0.556, + 2/9 = 0.778, + 1/9 = 0.889, + 1/9 = 1
    assert select_groups(scores, "top_p", 0.5, top_p_mode="softmax").tolist() == [2]
    assert select_groups(scores, "top_p", 0.7, top_p_mode="softmax").tolist() == [2, 1]
    assert select_groups(scores, "top_p", 0.8, top_p_mode="softmax").tolist() == [2, 1, 0]
    # without the two zero-score groups: 5/7 = 0.714, then 1
    assert select_groups(scores, "top_p", 0.7, top_p_mode="softmax", include_zero=False).tolist() == [2]
    assert select_groups(scores, "top_p", 0.8, top_p_mode="softmax", include_zero=False).tolist() == [2, 1]
    # smallest: softmax(-scores) -> 1, 1/2, 1/5, 1 over 2.7 -> groups 0 and 3 (0.370 each) first
    assert select_groups(scores, "top_p", 0.5, top_p_mode="softmax", largest=False).tolist() == [0, 3]
    std = group_scores(REWARDS, 3, "std")  # 0, 1, 1.732, 0.577
    assert select_groups(std, "min_p", 0.5).tolist() == [2, 1]  # >= 0.866
    assert select_groups(std, "min_p", 0.3).tolist() == [2, 1, 3]  # >= 0.520
    assert select_groups(std, "min_p", 0.3, include_zero=False, largest=False).tolist() == [3, 1, 2]  # <= 1.925
    assert select_groups(std, "min_p", 0.5, include_zero=False, largest=False).tolist() == [3, 1]  # <= 1.155
    with pytest.raises(ValueError, match="rollout_filter_strategy"):
        select_groups(std, "top_q", 0.5)


def args(**kw):
    return filter_settings(**{"rollout_filter_ratio": 0.25, **kw})


def test_filter_groups_from_the_config_and_dealt_to_processes():
    assert filter_groups(REWARDS, 3, args(rollout_filter_ratio=0.5)).tolist() == [1, 2]  # sorted for the batch
    assert filter_groups(REWARDS, 3, args(rollout_filter_metric="none")).tolist() == [0, 1, 2, 3]
    assert filter_groups(REWARDS, 3, args(rollout_filter_metric="std_rev", rollout_filter_ratio=0.5)).tolist() == [
        0,
        3,
    ]
    top_p = args(rollout_filter_strategy="top_p", rollout_filter_ratio=0.95, rollout_filter_metric="variance")
    assert filter_groups(REWARDS, 3, top_p).tolist() == [1, 2, 3]
    # 3 groups of 3 rows = 9 rows do not divide between 2 processes: the lowest-ranked (3) is dropped
    assert filter_groups(REWARDS, 3, top_p, num_processes=2).tolist() == [1, 2]
    assert filter_groups(REWARDS, 3, top_p, num_processes=3).tolist() == [1, 2, 3]
    # normalising each group would give both groups the same std (1): the filter ranks RAW rewards (0.1 vs 10)
    assert filter_groups(
        torch.tensor([0.0, 0.1, 0.2, 0.0, 10.0, 20.0]), 3, args(rollout_filter_ratio=0.5)
    ).tolist() == [1]
    entropy = args(rollout_filter_metric="entropy", rollout_filter_ratio=0.5)
    assert filter_groups(REWARDS, 3, entropy, entropies=torch.arange(12.0)).tolist() == [2, 3]


def test_padding_and_episode_filter_values():
    assert [padded_rows(n, 4) for n in (0, 1, 4, 5, 8)] == [4, 4, 4, 8, 8]
    assert [padded_rows(n, 1) for n in (0, 3)] == [1, 3]
    ep = Episode(StartState("starpo/Bandit-v0", 0), [1], [5, 6, 7, 8], [1, 1, 0, 1], [-0.5, -1.0, 0.0, -1.5])
    empty = Episode(StartState("starpo/Bandit-v0", 1), [1])
    assert episode_filter_values([ep], "std") == (None, None)
    assert episode_filter_values([ep, empty], "length") == (None, [3, 0])
    entropies, _ = episode_filter_values([ep, empty], "entropy")
    assert entropies[0] == pytest.approx(1.0) and math.isnan(entropies[1])  # (0.5 + 1 + 1.5) / 3 model tokens


def test_per_env_quota_and_global_ranking_by_hand():
    # groups of 3 with stds 0, 1, sqrt(3), sqrt(1/3) (REWARDS); env 0 holds groups 2 and 3, env 1 groups 0 and 1
    envs = [1, 1, 0, 0]
    quarter = args(rollout_filter_ratio=0.25)
    # globally the top quarter is group 2 alone; a quota keeps ceil(0.25 * 2) = 1 group of each env
    assert filter_groups(
        REWARDS, 3, args(rollout_filter_ratio=0.25, rollout_filter_scope="global"), group_env=envs
    ).tolist() == [2]
    assert filter_groups(REWARDS, 3, quarter, group_env=envs).tolist() == [1, 2]
    # stds rank the groups 2, 1, 3, 0: globally the top half is groups 2 and 1
    assert filter_groups(
        REWARDS, 3, args(rollout_filter_ratio=0.5, rollout_filter_scope="global"), group_env=envs
    ).tolist() == [1, 2]
    # per env with include_zero=False: env 1 keeps only group 1 (group 0 has std 0), env 0 both of its groups
    no_zero = args(rollout_filter_ratio=1.0, rollout_filter_include_zero=False)
    assert filter_groups(REWARDS, 3, no_zero, group_env=envs).tolist() == [1, 2, 3]
    # 9 rows do not divide between 2 processes: the lowest-scored kept group over both envs (3) is dropped
    assert filter_groups(REWARDS, 3, no_zero, group_env=envs, num_processes=2).tolist() == [1, 2]
    # linear top_p per env: env 1 has variances 0, 1 -> group 1; env 0 has 3, 1/3: 0.9 * 10/3 - 0.01 = 2.99 -> group 2
    top_p = args(
        rollout_filter_strategy="top_p",
        rollout_filter_ratio=0.9,
        rollout_filter_metric="variance",
        rollout_filter_include_zero=False,
    )
    assert filter_groups(REWARDS, 3, top_p, group_env=envs).tolist() == [1, 2]


def test_ties_keep_the_earlier_group_among_many_groups():
    """40 groups scoring 0, 1 or 2 (torch's default sort reorders ties from about 32 elements on): ties rank in
    group order, for the strategies and for the per-env global ranking."""
    scores = torch.tensor([float(i % 3) for i in range(40)])
    twos, ones = [i for i in range(40) if i % 3 == 2], [i for i in range(40) if i % 3 == 1]
    assert select_groups(scores, "top_k", 1.0).tolist()[: len(twos) + len(ones)] == twos + ones
    assert select_groups(scores, "top_p", 1.0, include_zero=False).tolist() == twos + ones
    rewards = torch.tensor([[0.0, float(i % 3)] for i in range(40)]).flatten()  # group std grows with i % 3
    per_env = filter_settings(rollout_filter_ratio=1.0, rollout_filter_scope="per_env")
    kept = filter_groups(rewards, 2, per_env, num_processes=3, group_env=[i % 2 for i in range(40)])
    # 40 groups of 2 rows = 80 rows: one group dropped to divide by 3, the lowest-ranked: zero-std groups rank
    # env by env (env 0's 0, 6, ..., 36, then env 1's 3, 9, ..., 39), so the last of env 1's, 39
    assert kept.tolist() == sorted(set(range(40)) - {39})


def test_defaults_and_boundaries_by_hand():
    # defaults: std, top_k, keep 0.25
    assert torch.equal(group_scores(REWARDS, 3), group_scores(REWARDS, 3, "std"))
    assert select_groups(group_scores(REWARDS, 3)).tolist() == [2]
    # top_p linear: a threshold of exactly 0 (0.5 * 0.02 - 0.01) keeps nothing
    assert select_groups(torch.tensor([0.02], dtype=torch.float64), "top_p", 0.5).tolist() == []
    # a cumulative score that reaches the threshold exactly (2 of 2 + 2, threshold 0.5 * 4 - 0) stops there
    assert select_groups(torch.tensor([2.0, 2.0], dtype=torch.float64), "top_p", 0.5, eps=0.0).tolist() == [0]
    # softmax: two equal scores, mass 0.5 after the first: 0.5 is reached
    assert select_groups(torch.tensor([1.0, 1.0]), "top_p", 0.5, top_p_mode="softmax").tolist() == [0]
    # min_p smallest keeps scores up to and including min / value (1 / 0.5 = 2)
    assert select_groups(torch.tensor([1.0, 2.0, 3.0]), "min_p", 0.5, largest=False).tolist() == [0, 1]
    # no candidate at all (every group scored 0, zero groups dropped): nothing kept, for every strategy
    for strategy in ("top_p", "min_p"):
        assert select_groups(torch.zeros(3), strategy, 0.5, include_zero=False).tolist() == []


def test_filter_errors_say_what_to_change():
    with pytest.raises(
        ValueError, match=r"min_p compares shares of the scores, which must be non-negative \(got -1\): use a metric"
    ):
        select_groups(torch.tensor([-1.0, 2.0]), "min_p", 0.5)
    with pytest.raises(
        ValueError,
        match=r"^top_p linear compares shares.*\(std, reward_variance, variance, entropy, length\) or the top_k / softmax top_p strategies\.$",
    ):
        select_groups(torch.tensor([-1.0, 2.0]), "top_p", 0.5)
    with pytest.raises(
        ValueError, match=r"^top_p linear keeps a share of the score mass from the top: use largest, or softmax mode$"
    ):
        select_groups(torch.tensor([1.0, 2.0]), "top_p", 0.5, largest=False)
    with pytest.raises(
        ValueError, match=r"rollout_filter_top_p_mode must be one of \('linear', 'softmax'\), got 'cubic'"
    ):
        select_groups(torch.tensor([1.0, 2.0]), "top_p", 0.5, top_p_mode="cubic")


def ragen_top_p_linear(rewards: torch.Tensor, num_groups: int, p: float, eps: float) -> list[int]:
    """RAGEN's selection for its recommended setting, written from its code (mll-lab-nu/RAGEN,
    ragen/trainer/rollout_filter.py: RewardRolloutFilter with metric reward_variance, strategy top_p, linear
    mode, include_zero False): score = torch std of each group's rewards; drop |score| <= 1e-10; sort
    descending; add scores while the sum is below p * total - eps (stopping at a score <= 0); keep them if
    the sum reached the threshold, else none."""
    scores = rewards.view(num_groups, -1).std(dim=-1)
    indices = torch.arange(num_groups)
    nonzero = scores.abs() > 1e-10
    scores, indices = scores[nonzero], indices[nonzero]
    if not len(indices):
        return []
    ordered, order = torch.sort(scores, descending=True, stable=True)
    threshold, total, count = p * scores.sum() - eps, 0.0, 0
    for score in ordered:
        if total >= threshold or score.item() <= 0:
            break
        total += score.item()
        count += 1
    return sorted(indices[order[:count]].tolist()) if total >= threshold else []


def test_the_ragen2_recipe_keeps_the_groups_ragen_keeps():
    """recipes/sokoban-qwen2.5-0.5b-ragen2.yaml against RAGEN's own rule on 200 random batches of binary rewards
    (8 groups x 16): the same groups every time. Ranking by the std squared (what reward_variance computed
    before, now the metric `variance`) keeps other groups in many of them (#45, item 13)."""
    import pathlib

    import yaml

    recipe = yaml.safe_load(
        (pathlib.Path(__file__).parents[2] / "recipes/sokoban-qwen2.5-0.5b-ragen2.yaml").read_text()
    )
    settings = filter_settings(**{k: v for k, v in recipe.items() if k.startswith("rollout_filter_")})
    squared = filter_settings(**{**vars(settings), "rollout_filter_metric": "variance"})
    gen = torch.Generator().manual_seed(0)
    differ = 0
    for _ in range(200):
        success = torch.rand(8, 1, generator=gen)  # each start state its own success rate
        rewards = (torch.rand(8, 16, generator=gen) < success).float().view(-1)
        expected = ragen_top_p_linear(rewards, 8, settings.rollout_filter_ratio, settings.rollout_filter_eps)
        assert filter_groups(rewards, 16, settings).tolist() == expected
        differ += filter_groups(rewards, 16, squared).tolist() != expected
    assert differ >= 40  # the old behaviour fails this comparison in a large share of batches
