"""The held-out Bandit pairs and the varied payouts: coverage, no overlap with training, decidable prompts."""

import math

import gymnasium as gym
import pytest

import envs  # noqa: F401
from envs.bandit import HELDOUT_PAIRS, MIN_GAP, PAYOUT_TRAIN_PAIRS, SYMBOLIC_TEST_ARMS, TRAIN_ARMS


def test_sixteen_held_out_pairs_none_seen_in_training_each_shown_once_in_sixteen_seeds():
    names = {n.lower() for pair in HELDOUT_PAIRS for n in pair}
    seen = {n.lower() for pair in [*PAYOUT_TRAIN_PAIRS, TRAIN_ARMS, *SYMBOLIC_TEST_ARMS] for n in pair}
    assert len(HELDOUT_PAIRS) >= 16 and len(names) == 2 * len(HELDOUT_PAIRS) and not names & seen
    assert HELDOUT_PAIRS[0] == ("Tiger", "Crane")  # BanditTest-v0's pair is one of them
    env = gym.make("starpo/BanditHeldout-v0").unwrapped
    shown = []
    for seed in range(256):
        obs, _ = env.reset(seed=seed)
        shown.append(tuple(env.action_names))
        assert f"Arm {env.action_names[0]}:" in obs and f"Arm {env.action_names[1]}:" in obs
    assert all(shown.count(pair) == 16 for pair in HELDOUT_PAIRS)  # 256 episodes: every pair 16 times
    assert shown[:16] == HELDOUT_PAIRS and shown[16:32] == HELDOUT_PAIRS


@pytest.mark.parametrize("env_id", ["starpo/BanditPayouts-v0", "starpo/BanditPayoutsHeldout-v0"])
def test_varied_payouts_are_shown_decidable_and_the_safe_arm_wins_about_half(env_id):
    env = gym.make(env_id).unwrapped
    safe_better = 0
    for seed in range(400):
        obs, _ = env.reset(seed=seed)
        safe, risky, prob = env.safe_reward, env.risky_reward, env.risky_prob
        assert 0.1 <= safe <= 0.6 and 0.5 <= risky <= 1.5 and 0.1 <= prob <= 0.6
        assert abs(risky * prob - safe) >= MIN_GAP - 1e-9  # decidable from the numbers shown
        assert f"pays {safe} every time." in obs and f"pays {risky} with probability {prob}, otherwise 0." in obs
        safe_better += safe > risky * prob
        # the expert (and success) follow the expected payouts of this seed
        best = env.action_names[env.best_arm]
        assert (best == env.action_names[1 - env.risky]) == (safe > risky * prob)
        _, reward, done, _, info = env.step(best)
        assert done and info["success"]
    assert 0.35 <= safe_better / 400 <= 0.6
    # the same seed, the same payouts, on every machine
    a, b = gym.make(env_id).unwrapped, gym.make(env_id).unwrapped
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]


def test_expected_reward_pays_the_drawn_expected_payout():
    env = gym.make("starpo/BanditPayouts-v0", expected_reward=True).unwrapped
    env.reset(seed=3)
    risky_name = env.action_names[env.risky]
    _, reward, *_ = env.step(risky_name)
    assert math.isclose(reward, env.risky_reward * env.risky_prob)


def test_variant_settings_that_make_no_sense_are_refused():
    with pytest.raises(ValueError, match="vary_payouts needs show_payouts=True"):
        gym.make("starpo/Bandit-v0", vary_payouts=True, show_payouts=False)
    with pytest.raises(ValueError, match="pair_by_seed is for the held-out pairs"):
        gym.make("starpo/Bandit-v0", pair_by_seed=True, mirror_seeds=True)
