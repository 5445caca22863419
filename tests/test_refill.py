"""The refilled batch (``rollout_filter_refill``, starpo_trl/refill.py): hand-worked pools of rounds, the fresh
seeds, the settings' refusals, and training steps that refill on one process and on two."""

import math

import pytest
import torch
from conftest import ScriptedBackend
from helpers import filter_settings, make_args

from starpo_trl import MultiTurnStarPOTrainer
from starpo_trl.algorithms.filters import best_groups
from starpo_trl.refill import FreshSeeds, Refilled, refill, refill_metrics, round_filter
from starpo_trl.rollout import Episode, StartState


def rounds_of(kept_and_scores, largest=True):
    """``select`` and ``play_round`` for ``refill`` from a script: round r's kept groups (indices within the
    round) and its groups' scores. Episodes are stand-in strings "r/group/member"; ``played`` records the
    rounds asked for."""
    played = []

    def episodes(r, groups=4, size=2):
        return [f"{r}/{g}/{m}" for g in range(groups) for m in range(size)]

    def select(eps, group_env):
        r = int(eps[0].split("/")[0])
        kept, scores = kept_and_scores[r]
        return torch.tensor(kept, dtype=torch.long), torch.tensor(scores), largest

    def play_round(r):
        played.append(r)
        return episodes(r) if r < len(kept_and_scores) else None

    return episodes(0), select, play_round, played


def test_a_short_round_is_refilled_with_the_best_kept_groups_of_every_round():
    # round 0 keeps group 1 (score .5); round 1 keeps its groups 0 (.4) and 3 (.7), i.e. pool groups 4 and 7.
    # Target 2: the best two of {1: .5, 4: .4, 7: .7} are 7 and 1, sorted -> [1, 7].
    first, select, play, played = rounds_of([([1], [0, 0.5, 0, 0]), ([0, 3], [0.4, 0, 0, 0.7])])
    out = refill(first, [0, 0, 0, 0], 2, target=2, max_rounds=4, num_processes=1, select=select, play_round=play)
    assert out.kept_groups.tolist() == [1, 7]
    assert out.rounds == 2 and played == [1] and out.target == 2
    assert out.episodes[:8] == first and out.episodes[8] == "1/0/0" and len(out.episodes) == 16
    assert out.group_env == [0] * 8


def test_with_smallest_first_the_lowest_scores_of_the_pool_are_kept():
    first, select, play, _ = rounds_of([([1], [0, 0.5, 0, 0]), ([0, 3], [0.4, 0, 0, 0.7])], largest=False)
    out = refill(first, [0, 0, 0, 0], 2, target=2, max_rounds=4, num_processes=1, select=select, play_round=play)
    assert out.kept_groups.tolist() == [1, 4]  # .5 and .4, not .7


def test_no_extra_round_when_the_first_keeps_enough_and_a_long_first_round_is_cut_to_the_target():
    first, select, play, played = rounds_of([([0, 2, 3], [0.3, 0, 0.9, 0.6])])
    out = refill(first, [0] * 4, 2, target=2, max_rounds=4, num_processes=1, select=select, play_round=play)
    assert out.kept_groups.tolist() == [2, 3] and out.rounds == 1 and played == []
    assert out.episodes == first


def test_rounds_stop_at_max_rounds_or_when_no_seed_is_left_and_keep_what_there_is():
    script = [([], [0.0] * 4), ([2], [0, 0, 0.2, 0]), ([], [0.0] * 4), ([1], [0, 0.8, 0, 0])]
    first, select, play, played = rounds_of(script)
    out = refill(first, [0] * 4, 2, target=3, max_rounds=3, num_processes=1, select=select, play_round=play)
    assert out.rounds == 3 and played == [1, 2] and out.kept_groups.tolist() == [6]
    first, select, play, played = rounds_of(script[:2])  # round 2 finds no fresh seed
    out = refill(first, [0] * 4, 2, target=3, max_rounds=10, num_processes=1, select=select, play_round=play)
    assert out.rounds == 2 and played == [1, 2] and out.kept_groups.tolist() == [6]


def test_kept_groups_are_cut_lowest_first_until_they_divide_among_the_processes():
    # 3 kept groups of 2 episodes = 6 rows: divides by 2 processes; by 4 it needs 2 groups (the lowest, .1, goes)
    first, select, play, _ = rounds_of([([0, 1, 3], [0.5, 0.1, 0, 0.9])])
    out = refill(first, [0] * 4, 2, target=3, max_rounds=1, num_processes=2, select=select, play_round=play)
    assert out.kept_groups.tolist() == [0, 1, 3]
    out = refill(first, [0] * 4, 2, target=3, max_rounds=1, num_processes=4, select=select, play_round=play)
    assert out.kept_groups.tolist() == [0, 3]


def test_best_groups_ranks_by_score_ties_to_the_earlier_nan_last_and_smallest_first_when_asked():
    scores = torch.tensor([0.5, float("nan"), 0.5, 0.9, 0.1])
    candidates = torch.tensor([4, 2, 1, 0, 3])  # given in any order
    assert best_groups(scores, candidates, 5).tolist() == [3, 0, 2, 4, 1]
    assert best_groups(scores, candidates, 2).tolist() == [3, 0]
    assert best_groups(scores, candidates, 3, largest=False).tolist() == [4, 0, 2]
    assert best_groups(scores, torch.tensor([], dtype=torch.long), 2).tolist() == []


def test_fresh_seeds_are_new_distinct_deterministic_and_run_out():
    seeds = FreshSeeds(range(10, 30), seed=7)
    seeds.mark([10, 11, 12, 13])
    a = seeds.draw(6, step=3, round_=1)
    assert len(set(a)) == 6 and not set(a) & {10, 11, 12, 13} and all(10 <= s < 30 for s in a)
    again = FreshSeeds(range(10, 30), seed=7)
    again.mark([10, 11, 12, 13])
    assert again.draw(6, step=3, round_=1) == a  # every process draws the same
    b = seeds.draw(6, step=3, round_=2)
    assert not set(a) & set(b) and seeds.left() == 4
    assert seeds.draw(5, step=4, round_=1) is None and seeds.left() == 4  # nothing drawn when too few are left
    assert sorted(seeds.draw(4, step=4, round_=1)) == sorted(set(range(10, 30)) - {10, 11, 12, 13} - set(a) - set(b))
    seeds.mark([5, 99])  # seeds outside the range (e.g. a user's own dataset) do not count against it
    assert seeds.left() == 0
    restored = FreshSeeds(range(10, 30), seed=7)
    restored.load_state_dict(seeds.state_dict())
    assert restored.played == seeds.played and restored.state_dict() == seeds.state_dict()
    assert FreshSeeds(range(3), 0).state_dict() == {"refill_played_seeds": []}


def test_fresh_seeds_of_a_huge_range_are_drawn_without_listing_it():
    seeds = FreshSeeds(range(0, 10**9), seed=0)
    seeds.mark(range(1000))
    drawn = seeds.draw(50, step=0, round_=1)
    assert len(set(drawn)) == 50 and min(drawn) >= 0 and not set(drawn) & set(range(1000))
    assert seeds.left() == 10**9 - 1050


def test_a_huge_range_never_draws_a_played_seed(monkeypatch):
    import starpo_trl.refill

    monkeypatch.setattr(starpo_trl.refill, "LISTED_SEEDS", 0)  # draw by retries, as from a huge range
    seeds = FreshSeeds(range(20), seed=1)
    seeds.mark(range(15))
    assert sorted(seeds.draw(5, step=0, round_=1)) == [15, 16, 17, 18, 19]


def _episode(seed: int, reward: float) -> Episode:
    ep = Episode(StartState("starpo/Bandit-v0", seed, ()), [1])
    ep.turn_rewards = [reward]
    return ep


def test_round_filter_keeps_non_constant_groups_and_scores_them_by_std():
    args = filter_settings(rollout_filter_include_zero=False, env_error_policy="exclude", env_failure_reward=0.0)
    rewards = [0.0, 0.0, 1.0, 0.0, 0.5, 0.5, 1.0, 1.0]  # groups of 2: std .., 0.7071, 0, 0
    select = round_filter(args, 2)
    kept, scores, largest = select([_episode(i, r) for i, r in enumerate(rewards)], [0, 0, 0, 0])
    assert kept.tolist() == [1] and largest is True  # top_k 0.25 of 4 = 1 group, the one with spread
    assert torch.allclose(scores, torch.tensor([0.0, math.sqrt(0.5), 0.0, 0.0]))
    args.rollout_filter_metric = "std_rev"  # the smallest non-zero std first
    assert round_filter(args, 2)([_episode(i, r) for i, r in enumerate(rewards)], [0] * 4)[2] is False


def test_refill_metrics():
    out = Refilled(list(range(24)), torch.tensor([1, 4]), [0] * 6, 3, target=2)
    assert refill_metrics(out, 4) == {
        "rollout/refill_rounds": 3.0,
        "rollout/groups_generated": 6.0,
        "rollout/refill_short": 0.0,
        "rollout/groups_generated_per_kept": 3.0,
    }
    short = refill_metrics(Refilled(list(range(8)), torch.tensor([], dtype=torch.long), [0, 0], 2, target=1), 4)
    assert short == {"rollout/refill_rounds": 2.0, "rollout/groups_generated": 2.0, "rollout/refill_short": 1.0}


# -- settings ----------------------------------------------------------------------------------------------
REFILL = dict(rollout_filter_refill=True, rollout_filter_include_zero=False)


def test_the_refill_target_defaults_to_the_strategys_count(tmp_path):
    assert make_args(tmp_path, **REFILL).refill_groups() == 2  # top_k 0.5 of 4
    assert (
        make_args(tmp_path, **REFILL, rollout_filter_strategy="top_k_abs", rollout_filter_ratio=3).refill_groups() == 3
    )
    assert (
        make_args(tmp_path, **REFILL, rollout_filter_strategy="top_p", rollout_filter_ratio=0.9).refill_groups() == 4
    )
    assert make_args(tmp_path, **REFILL, rollout_filter_refill_groups=3).refill_groups() == 3
    assert make_args(tmp_path, rollout_filter_include_zero=False).rollout_filter_refill is False


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(rollout_filter_refill=True), "rollout_filter_refill=True never refills"),
        (dict(rollout_filter_refill=True, rollout_filter_metric="none"), "never refills"),
        (dict(REFILL, rollout_filter_max_rounds=1), "rollout_filter_max_rounds=1 plays no extra round"),
        (dict(REFILL, rollout_filter_refill_groups=5), "rollout_filter_refill_groups=5 must be between 1 and"),
        (dict(REFILL, rollout_filter_refill_groups=0), "rollout_filter_refill_groups"),
    ],
)
def test_refill_settings_that_cannot_work_are_refused(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        make_args(tmp_path, **settings)


# -- training --------------------------------------------------------------------------------------------
# One turn per episode; generate call 0 (the first round of step 1): every reply is the same (no answer:
# every group's rewards are equal, the filter keeps none); later calls: half the replies name Dragon.
def constant_then_mixed(call: int, i: int) -> str:
    return "no answer here" if call == 0 or i % 2 else "<think>x</think><answer>Dragon</answer>"


def top(stds: list[float], k: int) -> list[int]:
    """The ``k`` largest, ties to the earlier group, sorted: worked out apart from the filter's code."""
    best = []
    for _ in range(k):
        best.append(max((i for i in range(len(stds)) if i not in best), key=lambda i: (stds[i], -i)))
    return sorted(best)


def test_a_training_step_refills_from_new_seeds_and_trains_on_the_target(tmp_path, tiny_model, tiny_tokenizer):
    args = make_args(tmp_path, **REFILL, max_steps=2, env_kwargs={"expected_reward": True}, num_train_seeds=1000)
    backend = ScriptedBackend(tiny_tokenizer, constant_then_mixed, tiny_tokenizer.eos_token_id)
    trainer = MultiTurnStarPOTrainer(tiny_model, args, processing_class=tiny_tokenizer, backend=backend)
    played = []
    play = trainer.play
    trainer.play = lambda starts, temperature: played.append([s.seed for s in starts]) or play(starts, temperature)
    trainer.train()
    first, second, third = played[0], played[1], played[2]  # step 1: two rounds; step 2: one
    assert len(played) == 3 and [len(x) for x in played] == [16, 16, 16]
    assert not set(second) & set(first) and len(set(second)) == 4  # new start states, 4 groups of 4
    assert all(len(set(second[g * 4 : g * 4 + 4])) == 1 for g in range(4))
    step1, step2 = trainer.kept_group_history
    assert len(step1["group_std"]) == 8 and step1["group_std"][:4] == [0.0] * 4 and min(step1["group_std"][4:]) > 0
    assert step1["kept"] == top(step1["group_std"], 2) and min(step1["kept"]) >= 4  # both from round 2
    assert len(step2["group_std"]) == 4 and step2["kept"] == top(step2["group_std"], 2)
    logs = [r for r in trainer.state.log_history if "rollout/refill_rounds" in r]
    assert [r["rollout/refill_rounds"] for r in logs] == [2.0, 1.0]
    assert [r["rollout/groups_generated"] for r in logs] == [8.0, 4.0]
    assert [r["rollout/groups_generated_per_kept"] for r in logs] == [4.0, 2.0]
    assert [r["rollout/refill_short"] for r in logs] == [0.0, 0.0]
    assert [r["rollout/kept_fraction"] for r in logs] == [0.25, 0.5]
    assert set(first) | set(second) | set(third) <= trainer.refiller.seeds.played
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert "| rollout filter: more start states while too few groups are kept | `True` |" in card


def test_evaluation_never_refills(tmp_path, tiny_model, tiny_tokenizer):
    args = make_args(tmp_path, **REFILL, env_kwargs={"expected_reward": True})
    backend = ScriptedBackend(tiny_tokenizer, "no answer here", tiny_tokenizer.eos_token_id)
    trainer = MultiTurnStarPOTrainer(tiny_model, args, processing_class=tiny_tokenizer, backend=backend)
    trainer.evaluate_success()
    assert sum(backend.calls) == 8 and trainer.refiller.seeds.played == set()


@pytest.mark.trains
def test_two_processes_play_the_same_rounds_and_split_each_rounds_seeds(tmp_path):
    """tests/distributed/dist_refill.py under torchrun (2 CPU processes): both processes log the same rounds and
    kept groups; in every round each plays half of the round's groups, and no refill seed was played before."""
    from helpers import run_two_processes

    ranks = run_two_processes("dist_refill.py", tmp_path, 29587)
    assert ranks[0]["num_processes"] == 2
    assert ranks[0]["kept"] == ranks[1]["kept"] and ranks[0]["rounds"] == ranks[1]["rounds"] == [2.0, 1.0]
    stds = ranks[0]["group_std"]
    assert ranks[0]["kept"] == [top(stds[0], 2), top(stds[1], 2)] and min(ranks[0]["kept"][0]) >= 4
    for r0, r1 in zip(ranks[0]["played"], ranks[1]["played"]):
        assert len(r0) == len(r1) == 8 and not set(r0) & set(r1)
    step1_round1 = set(ranks[0]["played"][0]) | set(ranks[1]["played"][0])
    step1_round2 = set(ranks[0]["played"][1]) | set(ranks[1]["played"][1])
    assert len(step1_round2) == 4 and not step1_round1 & step1_round2


def test_a_resumed_run_remembers_the_seeds_played_before_the_checkpoint(tmp_path, tiny_tokenizer):
    from starpo_trl.tiny import build_tiny_model

    def run(max_steps, resume=None):
        args = make_args(
            tmp_path, **REFILL, max_steps=max_steps, env_kwargs={"expected_reward": True}, num_train_seeds=16,
            save_strategy="steps", save_steps=1,
        )  # fmt: skip
        backend = ScriptedBackend(tiny_tokenizer, constant_then_mixed, tiny_tokenizer.eos_token_id)
        model = build_tiny_model(tiny_tokenizer, seed=3, hidden_size=32, num_layers=1)
        trainer = MultiTurnStarPOTrainer(model, args, processing_class=tiny_tokenizer, backend=backend)
        played, play = [], trainer.play
        trainer.play = lambda starts, temperature: played.append([s.seed for s in starts]) or play(starts, temperature)
        trainer.train(resume_from_checkpoint=resume)
        return played, trainer

    before, _ = run(1)
    assert len(before) == 2  # the step's round and one refill round
    after, trainer = run(2, resume=str(tmp_path / "checkpoint-1"))
    assert len(after) == 2  # the resumed trainer's first call again answers alike: a refill round
    step1 = set(before[0]) | set(before[1])
    assert not set(after[1]) & step1 and step1 <= trainer.refiller.seeds.played


@pytest.mark.parametrize(
    "settings",
    [
        dict(advantage_estimator="gigpo", max_turns=2),
        dict(advantage_estimator="bilevel_gae", max_turns=2),
        dict(context_window="window:1", max_turns=2),
        dict(env_configs=[{"env_id": "starpo/Bandit-v0", "env_kwargs": {"expected_reward": True}, "n_groups": 2},
                          {"env_id": "starpo/Bandit-v0", "env_kwargs": {"expected_reward": True, "show_payouts": False},
                           "n_groups": 2, "name": "Bandit-hidden"}],
             env_id=None),
    ],
    ids=["gigpo", "critic", "context-window", "two-envs"],
)  # fmt: skip
def test_a_refilled_step_trains_with_per_turn_credit_a_critic_a_window_and_several_envs(
    tmp_path, tiny_model, tiny_tokenizer, settings
):
    kw = dict(REFILL, max_steps=1, env_kwargs={"expected_reward": True}, num_train_seeds=1000, **settings)
    args = make_args(tmp_path, **kw)
    first_round_calls = args.max_turns  # every reply of the first round's turns is the same

    def reply(call: int, i: int) -> str:
        return "no answer here" if call < first_round_calls or i % 2 else "<think>x</think><answer>Dragon</answer>"

    backend = ScriptedBackend(tiny_tokenizer, reply, tiny_tokenizer.eos_token_id)
    trainer = MultiTurnStarPOTrainer(tiny_model, args, processing_class=tiny_tokenizer, backend=backend)
    trainer.train()
    (step,) = trainer.kept_group_history
    stds = step["group_std"]
    assert len(stds) == 8 and min(step["kept"]) >= 4
    if "env_configs" in settings:  # the filter ranks each env's groups apart (rollout_filter_scope per_env): one each
        assert step["kept"] == [4 + top(stds[4:6], 1)[0], 6 + top(stds[6:8], 1)[0]]
    else:
        assert step["kept"] == top(stds, 2)
    (logged,) = [r for r in trainer.state.log_history if "rollout/refill_rounds" in r]
    assert logged["rollout/refill_rounds"] == 2.0 and logged["rollout/groups_generated_per_kept"] == 4.0


def test_the_refiller_reads_its_settings_once_and_needs_no_config():
    """Built from ``ScoringSettings`` and plain numbers (no StarPOConfig): the first round's two groups earn the
    same reward within each group, so the filter (``include_zero=False``) keeps none; a second round plays two
    seeds never played (drawn from the training range given) and keeps both of its groups, which have spread;
    the target (2) is met after 2 of the 3 rounds allowed, and the round's seconds add to the step's."""
    from types import SimpleNamespace

    from starpo_trl.algorithms.settings import ScoringSettings
    from starpo_trl.env_configs import EnvConfig
    from starpo_trl.refill import Refiller

    settings = ScoringSettings(
        rollout_filter_include_zero=False,
        rollout_filter_ratio=1.0,
        rollout_filter_max_rounds=3,
        env_failure_reward=0.0,
    )
    bandit = EnvConfig("starpo/Bandit-v0", {}, None, "Bandit-v0")
    played = []

    class Played(list):
        timings = {"rollout/generate_seconds": 1.5}

    def play(starts):
        played.append([s.seed for s in starts])
        return Played(_episode(s.seed, float(i % 2)) for i, s in enumerate(starts))  # rewards 0, 1 in each group

    accelerator = SimpleNamespace(num_processes=1, process_index=0)
    refiller = Refiller(settings, 2, 2, FreshSeeds(range(10), seed=0), [bandit] * 2, [0, 0], play, list, accelerator)
    first = [_episode(0, 1.0), _episode(0, 1.0), _episode(1, 0.0), _episode(1, 0.0)]
    timings = {"rollout/generate_seconds": 2.0}
    refilled, metrics = refiller(first, step=0, timings=timings)
    assert refilled.kept_groups.tolist() == [2, 3] and refilled.rounds == 2 and len(played) == 1
    new = sorted(set(played[0]))
    assert len(new) == 2 and not set(new) & {0, 1} and all(0 <= s < 10 for s in new)
    assert timings == {"rollout/generate_seconds": 3.5}
    assert metrics["rollout/refill_rounds"] == 2.0 and metrics["rollout/refill_short"] == 0.0
