import json
import os
import subprocess
import sys
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.bandit import BanditEnv
from envs.countdown import CountdownEnv, score_answer
from envs.countdown import solve as solve_countdown
from envs.expression import parse_expression
from envs.sokoban import TARGET, WALL, SokobanEnv
from envs.sokoban import solve as solve_sokoban

ALL_IDS = list(envs.ENV_IDS)
NAMED_ACTION_IDS = [i for i in ALL_IDS if gym.make(i).unwrapped.action_names is not None]


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_gymnasium_env_checker_passes(env_id):
    env = gym.make(env_id, render_mode="ansi")
    check_env(env.unwrapped, skip_render_check=False)


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_contract_info_keys_and_unknown_action(env_id):
    env = gym.make(env_id).unwrapped
    obs, info = env.reset(seed=3)
    assert isinstance(obs, str) and obs
    assert {"success", "action_is_valid", "action_is_effective"} <= set(info)
    assert isinstance(env.instructions, str) and env.instructions
    if env.action_names is None:
        return  # free-text envs: an unparseable answer is scored in their own tests
    obs2, reward, terminated, truncated, info = env.step("definitely not an action")
    assert obs2 == obs
    assert info["action_is_valid"] is False and info["action_is_effective"] is False
    assert not terminated


@pytest.mark.parametrize("env_id", NAMED_ACTION_IDS)
def test_actions_match_case_insensitively(env_id):
    env = gym.make(env_id).unwrapped
    env.reset(seed=1)
    name = env.action_names[0]
    assert env.match_action(f"  {name.upper()}\n") == 0
    assert env.match_action(name.lower()) == 0


# -- determinism across processes -------------------------------------------------------------------
SCRIPT = """
import json, gymnasium as gym, envs
out = {}
for env_id in envs.ENV_IDS:
    env = gym.make(env_id).unwrapped
    obs, _ = env.reset(seed=123)
    trace = [obs]
    for i in range(6):
        action = env.action_names[i % len(env.action_names)] if env.action_names else "1 + 2"
        o, r, term, trunc, info = env.step(action)
        trace.append([o, r, term, trunc, info["success"]])
        if term or trunc:
            break
    out[env_id] = trace
print(json.dumps(out))
"""


def test_same_seed_same_episode_in_two_processes_with_different_hash_seeds():
    outputs = []
    for hash_seed in ("1", "987654"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True)
        outputs.append(json.loads(res.stdout))
    assert outputs[0] == outputs[1]
    assert set(outputs[0]) == set(ALL_IDS)


# -- Sokoban ------------------------------------------------------------------------------------------
def test_500_sokoban_rooms_are_solved_by_the_solver():
    env = SokobanEnv()
    for seed in range(500):
        env.reset(seed=seed)
        plan = solve_sokoban(env.fixed, env.boxes, env.player)
        assert plan, f"seed {seed} unsolvable or already solved"
        total = 0.0
        for i, action in enumerate(plan):
            _, r, term, _, info = env.step(action)
            total += r
            assert term == (i == len(plan) - 1)
        assert info["success"]


def _room(rows):
    env = SokobanEnv(dim_room=(len(rows), len(rows[0])))
    env.reset(seed=0)
    env.fixed = np.array(
        [[WALL if ch == "#" else (TARGET if ch in "OS√" else 1) for ch in row] for row in rows], dtype=np.int8
    )
    env.boxes = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "X√"}
    env.player = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "PS")
    return env


def test_sokoban_rewards_by_hand():
    env = _room(["######", "#P_XO#", "#____#", "######"])
    assert env.render_text() == "######\n#P_XO#\n#____#\n######"
    _, r, term, _, info = env.step("Right")  # walk: step cost only
    assert r == pytest.approx(-0.1) and not term and info["action_is_effective"]
    _, r, term, _, info = env.step("right")  # box onto target: -0.1 + 1 + 10
    assert r == pytest.approx(10.9) and term and info["success"]
    assert env.render_text() == "######\n#__P√#\n#____#\n######"

    env = _room(["######", "#_P√_#", "#____#", "######"])
    _, r, term, _, _ = env.step("Right")  # box off target: -0.1 - 1
    assert r == pytest.approx(-1.1) and not term
    assert env.render_text() == "######\n#__SX#\n#____#\n######"

    env = _room(["######", "#P___#", "#X_O_#", "######"])
    _, r, _, _, info = env.step("Up")  # wall bump: valid, not effective, step cost
    assert r == pytest.approx(-0.1) and info["action_is_valid"] and not info["action_is_effective"]
    _, r, _, _, info = env.step("Jump")
    assert r == pytest.approx(-0.1) and not info["action_is_valid"]


def test_sokoban_blocked_push_and_truncation():
    env = _room(["#####", "#PXX#", "#_O_#", "#####"])
    env.max_steps, env.steps = 2, 0
    before = env.render_text()
    _, r, term, trunc, info = env.step("Right")  # box against box: nothing moves
    assert env.render_text() == before and not info["action_is_effective"] and not trunc
    _, _, term, trunc, _ = env.step("Right")
    assert trunc and not term


def test_sokoban_alt_symbols_and_larger_rooms():
    env = gym.make("starpo/SokobanAlt-v0").unwrapped
    obs, _ = env.reset(seed=0)
    assert "#" not in obs and "W" in obs and "A" in obs
    big = SokobanEnv(dim_room=(8, 8), num_boxes=2)
    for seed in range(20):
        big.reset(seed=seed)
        assert len(big.boxes) == 2 and solve_sokoban(big.fixed, big.boxes, big.player)


def test_sokoban_cell_separator_gives_each_cell_its_own_token(tiny_tokenizer):
    """cell_separator=" ": the same room with a space between a row's cells (written out by hand), the same rewards;
    the tiny tokenizer merges runs of cells without it (a cell's column is not its token count) and gives each cell
    one token with it. A separator holding a newline or a room symbol is refused."""
    env = _room(["######", "#P_XO#", "#____#", "######"])
    env.cell_separator = " "
    assert env.render_text() == "# # # # # #\n# P _ X O #\n# _ _ _ _ #\n# # # # # #"
    _, r, _, _, _ = env.step("Right")
    assert r == pytest.approx(-0.1) and env.render_text().splitlines()[1] == "# _ P X O #"

    def tokens(text):
        return [tiny_tokenizer.decode([i]) for i in tiny_tokenizer(text, add_special_tokens=False)["input_ids"]]

    assert len(tokens("#__X##")) < 6  # merged: "#__" is one token
    assert [t.strip() for t in tokens("# _ _ X # #")] == ["#", "_", "_", "X", "#", "#"]
    fresh = SokobanEnv(cell_separator=" ")
    obs, _ = fresh.reset(seed=3)
    plain = SokobanEnv()
    assert obs.replace(" ", "") == plain.reset(seed=3)[0]  # the same room
    for bad in ("\n", "#", " X "):
        with pytest.raises(ValueError, match="cell_separator"):
            SokobanEnv(cell_separator=bad)


# -- FrozenLake ---------------------------------------------------------------------------------------
def test_frozenlake_transitions_agree_with_gymnasium():
    env = gym.make("starpo/FrozenLake-v0").unwrapped
    rng = np.random.default_rng(0)
    for seed in range(20):
        env.reset(seed=seed)
        ref = GymFrozenLake(desc=list(env.desc_rows), is_slippery=True)
        ref_state, _ = ref.reset(seed=seed)
        for _ in range(30):
            a = int(rng.integers(4))
            _, r, term, _, info = env.step(env.action_names[a])
            ref_state, ref_r, ref_term, _, _ = ref.step(a)
            assert env.state == ref_state and r == ref_r and term == ref_term
            if term:
                assert info["success"] == (env._cell(env.state) == "G")
                break


def test_frozenlake_render_and_rewards_by_hand():
    env = gym.make("starpo/FrozenLake-v0", desc=["SF", "HG"], is_slippery=False).unwrapped
    obs, _ = env.reset(seed=0)
    assert obs == "P_\nOG"
    obs, r, term, _, info = env.step("Right")
    assert obs == "_P\nOG" and r == 0 and not term and info["action_is_effective"]
    obs, r, term, _, info = env.step("Down")
    assert obs == "__\nO√"
    assert r == 1.0 and term and info["success"]
    env.reset(seed=0)
    obs, r, term, _, info = env.step("Down")
    assert obs == "__\nXG" and r == 0 and term and not info["success"]


def test_frozenlake_expert_beats_random():
    env = gym.make("starpo/FrozenLake-v0").unwrapped
    rng = np.random.default_rng(0)

    def success_rate(policy):
        wins = 0
        for seed in range(100):
            env.reset(seed=seed)
            for _ in range(100):
                _, _, term, trunc, info = env.step(policy())
                if term or trunc:
                    break
            wins += info["success"]
        return wins / 100

    expert = success_rate(env.expert_action)
    random = success_rate(lambda: env.action_names[int(rng.integers(4))])
    assert expert > 0.5 and expert > random + 0.3


# -- Bandit -------------------------------------------------------------------------------------------
def test_bandit_rules_by_hand():
    env = BanditEnv(risky_prob=1.0)
    env.reset(seed=0)
    risky, safe = env.action_names[env.risky], env.action_names[1 - env.risky]
    assert f"Arm {risky}: pays 1.0 with probability 1.0" in env.render_text()
    _, r, term, _, info = env.step(risky.upper())
    assert r == 1.0 and term and info["success"]
    env.reset(seed=0)
    _, r, term, _, info = env.step(safe)
    assert r == 0.15 and term and not info["success"]
    env = BanditEnv(risky_prob=0.0)
    env.reset(seed=0)
    _, r, _, _, info = env.step(env.action_names[env.risky])
    assert r == 0.0 and not info["success"]  # expected 0 < 0.15: the safe arm is better here


def test_bandit_seed_decides_risky_arm_and_test_names_differ():
    env = BanditEnv()
    risky = {env.reset(seed=s) and env.risky for s in range(40)}
    assert risky == {0, 1}
    test_env = gym.make("starpo/BanditTest-v0").unwrapped
    assert set(test_env.action_names).isdisjoint(env.action_names)


def test_symbolic_bandit_shows_names_only_and_the_high_risk_name_is_the_better_arm():
    train = gym.make("starpo/BanditSymbolic-v0").unwrapped
    test = gym.make("starpo/BanditSymbolicTest-v0").unwrapped
    orders, test_pairs = set(), set()
    for seed in range(40):
        obs, _ = train.reset(seed=seed)
        assert obs.startswith("Arms: ") and "pays" not in obs and "probability" not in obs
        assert train.action_names[train.risky] == "Dragon" and train.expert_action() == "Dragon"
        orders.add(tuple(train.action_names))
        _, _, term, _, info = train.step("dragon")
        assert term and info["success"]
        test.reset(seed=seed)
        names = tuple(test.action_names)
        high = names[test.risky]
        assert high in ("Shark", "Casino", "Sword", "Storm") and not {"Phoenix", "Dragon"} & set(names)
        test_pairs.add(frozenset(names))
        assert test.step(names[1 - test.risky])[4]["success"] is False
    assert orders == {("Phoenix", "Dragon"), ("Dragon", "Phoenix")} and len(test_pairs) == 4


def test_bandit_with_payouts_over_several_pairs_draws_a_pair_then_the_risky_name():
    from gymnasium.utils.seeding import np_random

    from envs.bandit import PAYOUT_TRAIN_PAIRS, TEST_ARMS

    assert not {name for pair in PAYOUT_TRAIN_PAIRS for name in pair} & set(TEST_ARMS)  # the test names stay unseen
    env, single = BanditEnv(arm_names=PAYOUT_TRAIN_PAIRS), BanditEnv()
    seen = set()
    for seed in range(60):
        obs, _ = env.reset(seed=seed)
        rng, _ = np_random(seed)  # the env's own generator: the pair first, then the risky index
        pair = PAYOUT_TRAIN_PAIRS[int(rng.integers(len(PAYOUT_TRAIN_PAIRS)))]
        assert tuple(env.action_names) == pair and env.risky == int(rng.integers(2))
        risky, safe = pair[env.risky], pair[1 - env.risky]
        assert f"Arm {risky}: pays 1.0 with probability 0.25" in obs and f"Arm {safe}: pays 0.15 every time." in obs
        assert env.expert_action() == risky and env.step(safe)[4]["success"] is False
        seen.add((pair, env.risky))
        single.reset(seed=seed)  # one pair: only the risky index is drawn, as before
        assert single.risky == int(np_random(seed)[0].integers(2))
    assert len({pair for pair, _ in seen}) == len(PAYOUT_TRAIN_PAIRS) and len(seen) > len(PAYOUT_TRAIN_PAIRS)


def test_bandit_mirror_seeds_show_each_pair_with_the_risky_arm_swapped():
    import numpy as np

    from envs.bandit import PAYOUT_TRAIN_PAIRS

    env = BanditEnv(arm_names=PAYOUT_TRAIN_PAIRS, mirror_seeds=True)
    seen = set()
    for k in range(200):
        rng = np.random.default_rng(k)  # seeds 2k and 2k+1 draw from k: the pair, then the first one's risky arm
        pair, first_risky = PAYOUT_TRAIN_PAIRS[int(rng.integers(len(PAYOUT_TRAIN_PAIRS)))], int(rng.integers(2))
        even, _ = env.reset(seed=2 * k)
        assert tuple(env.action_names) == pair and env.risky == first_risky
        assert env.expert_action() == pair[first_risky] and env.step(pair[first_risky])[4]["success"]
        odd, _ = env.reset(seed=2 * k + 1)
        assert tuple(env.action_names) == pair and env.risky == 1 - first_risky
        assert env.expert_action() == pair[1 - first_risky] and not env.step(pair[first_risky])[4]["success"]
        # the two observations differ only in which name the "with probability" line belongs to
        swap = {f"Arm {pair[0]}": f"Arm {pair[1]}", f"Arm {pair[1]}": f"Arm {pair[0]}"}
        swapped = [swap[line[: line.index(":")]] + line[line.index(":") :] for line in even.splitlines()]
        assert sorted(swapped) == sorted(odd.splitlines()) and even != odd
        seen.update({(pair, first_risky), (pair, 1 - first_risky)})
    assert len(seen) == 2 * len(PAYOUT_TRAIN_PAIRS)  # every prompt, as without mirroring
    with pytest.raises(ValueError, match="show_payouts=True"):
        BanditEnv(arm_names=("Phoenix", "Dragon"), show_payouts=False, mirror_seeds=True)


def test_bandit_expected_reward_pays_each_arms_mean_and_keeps_the_rest():
    from envs.bandit import PAYOUT_TRAIN_PAIRS

    for seed in range(20):
        noisy, mean = (
            BanditEnv(arm_names=PAYOUT_TRAIN_PAIRS),
            BanditEnv(arm_names=PAYOUT_TRAIN_PAIRS, expected_reward=True),
        )
        obs, _ = noisy.reset(seed=seed)
        assert mean.reset(seed=seed)[0] == obs and mean.action_names == noisy.action_names
        risky, safe = noisy.action_names[noisy.risky], noisy.action_names[1 - noisy.risky]
        assert mean.step(risky)[1:3] == (0.25, True) and noisy.step(risky)[1] in (0.0, 1.0)
        mean.reset(seed=seed)
        _, r, term, _, info = mean.step(safe)
        assert (r, term, info["success"]) == (0.15, True, False)
    mean = BanditEnv(risky_prob=0.1, expected_reward=True)  # expected 0.1 < 0.15: the safe arm is the better one
    mean.reset(seed=0)
    _, r, _, _, info = mean.step(mean.action_names[mean.risky])
    assert r == pytest.approx(0.1) and not info["success"]


# -- Countdown / Arithmetic ---------------------------------------------------------------------------
def test_countdown_scoring_by_hand():
    numbers, target = [7, 3, 5, 2], 22
    assert score_answer("(7 - 3) * 5 + 2", numbers, target) == (1.0, True)
    assert score_answer("(7 - 3) * 5 + 2 = 22", numbers, target) == (1.0, True)
    assert score_answer("7 + 3 + 5 + 2", numbers, target) == (0.1, True)
    assert score_answer("7 * 3 + 1", numbers, target) == (0.0, True)  # wrong numbers
    assert score_answer("(7 - 3) * 5 + 2 + 0", numbers, target) == (0.0, True)  # extra number
    assert score_answer("__import__('os')", numbers, target) == (0.0, False)
    assert score_answer("22", numbers, target) == (0.0, True)


def test_countdown_targets_are_reachable_and_solver_agrees():
    env = CountdownEnv()
    for seed in range(100):
        env.reset(seed=seed)
        assert 3 <= len(env.numbers) <= 4 and 1 <= env.target <= 100
        assert solve_countdown(env.numbers, env.target) is not None
        _, r, term, _, info = env.step(env.expert_action())
        assert r == 1.0 and term and info["success"]


def test_arithmetic_answers_by_hand_and_expert():
    env = gym.make("starpo/Arithmetic-v0").unwrapped
    for seed in range(60):
        env.reset(seed=seed)
        _, r, term, _, info = env.step(env.expert_action())
        assert r == 1.0 and term and info["success"]
    env.reset(seed=0)
    env.answer = Fraction(7, 2)
    assert env.step("7/2")[1] == 1.0
    env.reset(seed=0)
    env.answer = Fraction(42)
    assert env.step(" 42 ")[1] == 1.0 and env.step("42.0")[1] == 1.0
    env.reset(seed=0)
    _, r, _, _, info = env.step(" 6 * 7 ")  # an expression is not a number
    assert r == 0.0 and not info["action_is_valid"]
    env.reset(seed=0)
    env.answer = Fraction(42)
    _, r, _, _, info = env.step("forty-two")
    assert r == 0.0 and not info["action_is_valid"]


def test_arithmetic_does_not_pay_for_restating_the_question():
    import re

    env = gym.make("starpo/Arithmetic-v0").unwrapped
    paid = 0
    for seed in range(200):
        env.reset(seed=seed)
        expression = re.search(r"What is (.*)\?", env.question)
        if expression is not None:  # levels 1 and 2 ask for the value of an expression
            paid += env.step(expression.group(1))[1]
            env.reset(seed=seed)
        numbers = [int(n) for n in re.findall(r"\d+", env.question)]
        if len(numbers) >= 2:  # word problems: "total / friends" written out
            paid += (
                env.step(f"{numbers[0]}/{numbers[1]}")[1]
                if Fraction(numbers[0], numbers[1]).denominator != numbers[1]
                else 0
            )
    assert paid == 0
    from envs.expression import parse_number

    assert (
        parse_number("7/2") == Fraction(7, 2)
        and parse_number("-3.25") == Fraction(-13, 4)
        and parse_number("+12") == 12
    )
    for bad in ("84/12", "7/1", "1/0", "6*7", "(42)", "4 2", "", "--4", "0x2A", "1e3", "1,200"):
        assert parse_number(bad) is None, bad


def test_countdown_pays_only_for_the_given_numbers_each_once():
    numbers, target = [3, 5], 2
    assert score_answer("5 - 3", numbers, target) == (1.0, True)
    assert score_answer("-3 + 5", numbers, target) == (0.0, False)  # -3 is not a given number
    assert score_answer("+5 - 3", numbers, target) == (0.0, False)
    assert score_answer("5 - 3 - 0", numbers, target) == (0.0, True)
    assert score_answer("5 - 3 + 3 - 3", numbers, target) == (0.0, True)
    assert score_answer("5.0 - 3", numbers, target) == (1.0, True)  # the same number, written with a decimal point


def test_expression_parser_rejects_everything_but_arithmetic():
    assert parse_expression("1 + 2 * 3") == (Fraction(7), [Fraction(1), Fraction(2), Fraction(3)])
    assert parse_expression("(1 + 2) / 4")[0] == Fraction(3, 4)
    for bad in [
        "2 ** 1000000",
        "1 / 0",
        "x + 1",
        "__import__('os').system('true')",
        "(" * 500 + "1" + ")" * 500,
        "9" * 5000,
        "1; 2",
        "lambda: 1",
        "",
        "1e309",
        "[1]",
        "1 if 1 else 2",
    ]:
        assert parse_expression(bad) is None, bad


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parser_and_free_text_envs_never_raise(text):
    parse_expression(text)
    for env in (CountdownEnv(), gym.make("starpo/Arithmetic-v0").unwrapped):
        env.reset(seed=0)
        _, r, term, _, info = env.step(text)
        assert r in (0.0, 0.1, 1.0) and term


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(), max_size=50))
def test_named_action_envs_never_raise(text):
    for env_id in ("starpo/Sokoban-v0", "starpo/FrozenLake-v0", "starpo/Bandit-v0", "starpo/Taxi-v0"):
        env = gym.make(env_id).unwrapped
        env.reset(seed=0)
        env.step(text)


def test_toy_text_wrapper_expert_solves_taxi_and_cliffwalking():
    for env_id in ("starpo/Taxi-v0", "starpo/CliffWalking-v0"):
        env = gym.make(env_id).unwrapped
        obs, _ = env.reset(seed=5)
        assert "\x1b" not in obs
        for _ in range(50):
            _, _, term, _, info = env.step(env.expert_action())
            if term:
                break
        assert term and info["success"], env_id
