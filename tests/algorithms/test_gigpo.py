"""GiGPO's per-turn advantages (starpo_trl/algorithms/gigpo.py): by hand on small cases, and against an independent
port of the reference implementation's rules (verl-agent, gigpo/core_gigpo.py) on random batches."""

import math
import random
from collections import defaultdict

import pytest
import torch

from starpo_trl.algorithms.gigpo import discounted_returns, gigpo_advantages, relative
from starpo_trl.algorithms.settings import AdvantageSettings

# group of 2: episode 0 turns (0, 1) from states A, B; episode 1 turns (0, 0, 0) from A, C, B
TURNS = [[0.0, 1.0], [0.0, 0.0, 0.0]]
ANCHORS = [["A", "B"], ["A", "C", "B"]]


def test_discounted_returns_by_hand():
    assert discounted_returns([0.0, 1.0], 0.5) == [0.5, 1.0]
    assert discounted_returns([1.0, 2.0, 4.0], 0.5) == [1 + 0.5 * (2 + 0.5 * 4), 2 + 0.5 * 4, 4.0]
    assert discounted_returns([], 0.9) == []


def test_mean_norm_by_hand():
    """Episode rewards 1, 0: +-0.5. Returns (gamma 0.5): episode 0 [0.5, 1], episode 1 [0, 0, 0]. Anchor A holds
    0.5 and 0 (+-0.25), B holds 1 and 0 (+-0.5), C only episode 1's second turn (alone: 0)."""
    adv = gigpo_advantages([1.0, 0.0], TURNS, ANCHORS, 2, gamma=0.5, mode="mean_norm", step_advantage_weight=1.0)
    assert adv == [[0.75, 1.0], [-0.75, -0.5, -1.0]]
    half = gigpo_advantages([1.0, 0.0], TURNS, ANCHORS, 2, gamma=0.5, mode="mean_norm", step_advantage_weight=0.5)
    assert half == [[0.625, 0.75], [-0.625, -0.5, -0.75]]
    # weight 0: GRPO's mean-centred episode advantage on every turn
    assert gigpo_advantages([1.0, 0.0], TURNS, ANCHORS, 2, 0.5, "mean_norm", 0.0) == [[0.5, 0.5], [-0.5, -0.5, -0.5]]


def test_mean_std_norm_by_hand():
    """Every pair (1, 0), (0.5, 0), (1, 0) has unbiased std sqrt(0.5) x its gap: each side is +-1/sqrt(2)."""
    adv = gigpo_advantages([1.0, 0.0], TURNS, ANCHORS, 2, gamma=0.5, mode="mean_std_norm", step_advantage_weight=1.0)
    r = 1 / math.sqrt(2)
    assert adv[0] == pytest.approx([2 * r, 2 * r], abs=1e-5)
    assert adv[1] == pytest.approx([-2 * r, -r, -2 * r], abs=1e-5)
    assert relative([3.0, 3.0, 3.0], "mean_std_norm") == [0.0, 0.0, 0.0]  # no spread: no advantage, no division by 0
    assert relative([2.0], "mean_std_norm") == [0.0] and relative([2.0], "mean_norm") == [0.0]


def test_groups_are_separate_and_failed_episodes_are_left_out():
    """Anchor keys are compared within a start state's group only; a failed episode (NaN) gets 0 and is in no
    statistic; a group with one played episode gives it no episode advantage."""
    nan = float("nan")
    rewards = [1.0, 0.0, 5.0, nan]
    turns = [[1.0], [0.0], [5.0], [2.0]]
    anchors = [["S"], ["S"], ["S"], ["S"]]  # the same key in both groups
    adv = gigpo_advantages(rewards, turns, anchors, 2, gamma=1.0, mode="mean_norm", step_advantage_weight=1.0)
    assert adv == [[1.0], [-1.0], [0.0], [0.0]]  # group 2: one played episode, its turn alone
    settings = dict(gamma=1.0, mode="mean_norm", step_advantage_weight=1.0)
    whole = "^gigpo_advantages needs whole groups: one reward, turn-reward list and anchor list per episode$"
    with pytest.raises(ValueError, match=whole):
        gigpo_advantages([1.0, 0.0, 1.0], [[1.0]] * 3, [["S"]] * 3, 2, **settings)
    with pytest.raises(ValueError, match=whole):  # one anchor list short
        gigpo_advantages([1.0, 0.0], [[1.0], [0.0]], [["S"]], 2, **settings)
    with pytest.raises(ValueError, match=whole):  # one turn-reward list short
        gigpo_advantages([1.0, 0.0], [[1.0]], [["S"], ["S"]], 2, **settings)
    with pytest.raises(ValueError, match="has 2 turns but 1 anchor states"):
        gigpo_advantages([1.0, 0.0], [[0.0, 1.0], [0.0]], [["A"], ["A"]], 2, **settings)
    with pytest.raises(ValueError, match="mode must be one of"):
        gigpo_advantages([1.0, 0.0], [[1.0], [0.0]], [["A"], ["A"]], 2, 1.0, "std_norm", 1.0)


def reference_gigpo(rewards, turns, anchors, group_size, gamma, mode, weight, eps=1e-6):
    """The reference implementation's rules on its own data layout (one row per turn: group uid, trajectory uid,
    anchor observation, discounted step return; the episode reward on every row), with
    compute_mean_std_cross_steps=False; torch.std (unbiased) for groups of two or more, 1 for one."""
    rows = []
    for i, (ts, an) in enumerate(zip(turns, anchors)):
        running, returns = 0.0, []
        for r in reversed(ts):
            running = r + gamma * running
            returns.append(running)
        for t, (a, g) in enumerate(zip(an, reversed(returns))):
            rows.append(dict(index=i // group_size, traj=i, turn=t, obs=a, score=rewards[i], step=g))
    remove_std = mode == "mean_norm"

    def norm(key, value):
        groups, seen = defaultdict(list), set()
        for row in rows:
            if key == "episode":
                if (row["index"], row["traj"]) in seen:
                    continue
                seen.add((row["index"], row["traj"]))
            groups[group_of(row, key)].append(row[value])
        stats = {}
        for k, xs in groups.items():
            x = torch.tensor(xs, dtype=torch.float64)
            if key == "episode" and len(xs) == 1:
                stats[k] = (0.0, 1.0)
            else:
                stats[k] = (x.mean().item(), x.std().item() if len(xs) > 1 else 1.0)
        out = []
        for row in rows:
            mean, std = stats[group_of(row, key)]
            out.append(row[value] - mean if remove_std else (row[value] - mean) / (std + eps))
        return out

    def group_of(row, key):
        return row["index"] if key == "episode" else (row["index"], row["obs"])

    scores = [e + weight * s for e, s in zip(norm("episode", "score"), norm("step", "step"))]
    out = [[None] * len(ts) for ts in turns]
    for row, score in zip(rows, scores):
        out[row["traj"]][row["turn"]] = score
    return out


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_matches_the_reference_rules_on_random_batches(mode):
    """100 random batches: 4 groups of 4 episodes of 1-5 turns on a 3x3 grid of anchor states (so anchor groups
    of every size occur), random 0/1 turn rewards, gamma 0.9, weight 0.7."""
    rng = random.Random(0)
    sizes = defaultdict(int)
    for _ in range(100):
        turns = [[float(rng.random() < 0.3) for _ in range(rng.randint(1, 5))] for _ in range(16)]
        anchors = [[(rng.randint(0, 2), rng.randint(0, 2)) for _ in ts] for ts in turns]
        rewards = [sum(ts) for ts in turns]
        ours = gigpo_advantages(rewards, turns, anchors, 4, gamma=0.9, mode=mode, step_advantage_weight=0.7)
        theirs = reference_gigpo(rewards, turns, anchors, 4, 0.9, mode, 0.7)
        for a, b in zip(ours, theirs):
            assert a == pytest.approx(b, abs=1e-9)
        for g in range(4):
            counts = defaultdict(int)
            for i in range(4 * g, 4 * g + 4):
                for key in anchors[i]:
                    counts[key] += 1
            for c in counts.values():
                sizes[min(c, 3)] += 1
    assert sizes[1] and sizes[2] and sizes[3]  # lone turns, pairs and larger anchor groups all exercised


def test_turn_values_are_placed_on_each_turns_reply_tokens():
    """Token level: a whole-episode row's turns are its reply spans (env tokens between them 0); a per-turn row
    (context window) carries its turn's value on every token; padding rows are 0."""
    from starpo_trl.rollout.batch import turn_token_values
    from starpo_trl.rollout.engine import Episode, StartState

    start = StartState("starpo/FrozenLake-v0", 0)
    # completion: reply 0 = tokens 0-1, env tokens 2-3, reply 1 = tokens 4-6, env token 7
    whole = Episode(start, [1], completion_ids=list(range(8)), reply_starts=[0, 4], turn_end_positions=[1, 6])
    turn_rows = [Episode(start, [1], completion_ids=c) for c in ([5, 6], [7, 8, 9], [4])]
    rows = [whole, *turn_rows, whole]  # the last: padding
    values = turn_token_values(rows, [0, 1, 1, 1], [[0.5, -2.0], [3.0, 4.0, 5.0]], 9)
    assert values.tolist() == [
        [0.5, 0.5, 0, 0, -2.0, -2.0, -2.0, 0, 0],
        [3.0, 3.0, 0, 0, 0, 0, 0, 0, 0],
        [4.0, 4.0, 4.0, 0, 0, 0, 0, 0, 0],
        [5.0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0] * 9,
    ]
    # an episode that never acted (failed at reset) has no turns: its row stays 0, the rows after it do not
    never = Episode(start, [1])
    assert turn_token_values([never, whole], [0, 1], [[], [1.0, 2.0]], 8).tolist() == [
        [0] * 8,
        [1.0, 1.0, 0, 0, 2.0, 2.0, 2.0, 0],
    ]


def test_the_engine_records_the_state_each_turn_starts_from(tiny_tokenizer):
    """FrozenLake's state_key is the player's square; an env without one falls back to the observation text."""
    from conftest import ScriptedBackend

    from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState

    replies = ["<think>a</think><answer>Right</answer>", "<think>b</think><answer>Down</answer>", "x"]
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i: replies[call % 3], tiny_tokenizer.eos_token_id)
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=16, max_actions_per_turn=1)
    engine = RolloutEngine(tiny_tokenizer, backend, cfg, [tiny_tokenizer.eos_token_id])
    lake = (("is_slippery", False), ("desc", ("SFF", "FFF", "FFG")))
    for runner in ("inline", "processes"):  # the env in this process, or in a worker process
        engine.runner = type(engine.runner)(runner, None)
        (ep,) = engine.run([StartState("starpo/FrozenLake-v0", 0, lake)])
        assert ep.turn_states == [0, 1, 4] and ep.num_turns == 3  # start, after Right, after Down (a bad reply last)
    (bandit,) = engine.run([StartState("starpo/Bandit-v0", 3)])
    import gymnasium as gym

    env = gym.make("starpo/Bandit-v0")
    # no state_key: the observation the model read (the arms' text; invalid answers leave it as it was)
    assert bandit.num_turns == 3 and bandit.turn_states == [env.reset(seed=3)[0]] * 3


@pytest.mark.trains
@pytest.mark.parametrize("window", ["full", "single_turn"])
def test_training_with_gigpo_puts_each_turns_advantage_on_its_tokens(tmp_path, tiny_tokenizer, fresh_model, window):
    """One training step on FrozenLake with advantage_estimator='gigpo': every model token of turn t of kept episode
    i carries A(i, t) (computed here from the played episodes' rewards, turn rewards and recorded states), env
    tokens and padding 0; with a context window the same on one row per turn."""
    from conftest import ScriptedBackend
    from helpers import make_args

    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.rollout.batch import episode_rows

    moves = ["Right", "Down", "Left", "Up"]

    def replies(call, i):  # different moves per episode and turn, some malformed: returns and states differ
        return "no format" if (call + i) % 5 == 0 else f"<think>go</think><answer>{moves[(call * 3 + i) % 4]}</answer>"

    args = make_args(
        tmp_path,
        env_id="starpo/FrozenLake-v0",
        env_kwargs={"is_slippery": False},
        advantage_estimator="gigpo",
        gigpo_mode="mean_norm",
        step_advantage_weight=0.5,
        turn_gamma=0.9,
        context_window=window,
        max_turns=3,
        max_actions_per_turn=1,
        max_steps=1,
        rollout_filter_ratio=1.0,
        loss_aggregation="token-mean",
    )
    backend = ScriptedBackend(tiny_tokenizer, replies, tiny_tokenizer.eos_token_id)
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer, backend=backend)
    batches, played = [], []
    step, play = trainer._generate_and_score_completions, trainer.play
    trainer._generate_and_score_completions = lambda inputs: batches.append(step(inputs)) or batches[-1]
    trainer.play = lambda starts, t: played.append(play(starts, t)) or played[-1]
    trainer.train()
    episodes = list(played[0])
    assert all(len(ep.turn_states) == ep.num_turns for ep in episodes)
    expected = gigpo_advantages(
        [ep.reward for ep in episodes],
        [ep.turn_rewards for ep in episodes],
        [ep.turn_states for ep in episodes],
        4,
        0.9,
        "mean_norm",
        0.5,
    )
    assert len({round(x, 6) for turns in expected for x in turns}) > 2  # the turns' advantages differ
    rows, owner = episode_rows(episodes)
    adv = batches[0]["advantages"]
    seen = {}
    for r, (row, k) in enumerate(zip(rows, owner)):
        j = seen.get(k, 0)
        seen[k] = j + 1
        want = torch.zeros(adv.size(1))
        if window == "full":
            for t, (a, b) in enumerate(zip(row.reply_starts, row.turn_end_positions)):
                want[a : b + 1] = expected[k][t]
        else:
            want[: len(row.completion_ids)] = expected[k][j]
        want = want * torch.tensor(row.env_mask + [0] * (adv.size(1) - len(row.env_mask)), dtype=torch.float32)
        assert adv[r].tolist() == pytest.approx(want.tolist(), abs=1e-6), (r, k)
    assert not adv[len(rows) :].any()  # padding rows
    with pytest.raises(ValueError, match="gigpo_mode must be one of"):
        make_args(tmp_path, advantage_estimator="gigpo", gigpo_mode="std")
    with pytest.raises(ValueError, match="skip_zero_advantage_steps needs a group estimator"):
        make_args(tmp_path, advantage_estimator="gigpo", skip_zero_advantage_steps=True)


def test_the_registry_turns_the_whole_kept_batch_into_this_processs_token_advantages():
    """estimators.turn_advantages: GiGPO on every kept episode (scored.keep order, kept rewards), then this process's
    share ``mine`` placed on its rows' reply tokens."""
    from types import SimpleNamespace

    from starpo_trl.algorithms.estimators import turn_advantages
    from starpo_trl.rollout.engine import Episode, StartState

    def ep(seed, turns, states):
        n = len(turns)  # one token per reply, one env token after it: reply t at 2t
        return Episode(
            StartState("starpo/FrozenLake-v0", seed),
            [1],
            completion_ids=list(range(2 * n)),
            turn_rewards=turns,
            turn_states=states,
            reply_starts=[2 * t for t in range(n)],
            turn_end_positions=[2 * t for t in range(n)],
        )

    episodes = [ep(9, [5.0], ["Z"]), ep(9, [5.0], ["Z"]), ep(1, [0.0, 1.0], ["A", "B"]), ep(1, [0.0, 0.0], ["A", "C"])]
    scored = SimpleNamespace(keep=torch.tensor([2, 3]), kept_rewards=torch.tensor([1.0, 0.0]))
    settings = AdvantageSettings(
        advantage_estimator="gigpo", turn_gamma=0.5, gigpo_mode="mean_norm", step_advantage_weight=1.0
    )
    # episode adv +-0.5 (groups of 2); anchor A: returns 0.5 and 0 (+-0.25); B and C alone
    rows = [episodes[3]]  # this process holds the second kept episode
    adv = turn_advantages(episodes, scored, settings, 2, slice(1, 2), rows, [0], 5)
    assert adv.tolist() == [[-0.75, 0, -0.5, 0, 0]]
    both = turn_advantages(episodes, scored, settings, 2, slice(0, 2), [episodes[2], episodes[3]], [0, 1], 4)
    assert both.tolist() == [[0.75, 0, 0.5, 0], [-0.75, 0, -0.5, 0]]
