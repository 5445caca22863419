"""starpo/ReasoningGym-v0: reasoning-gym's questions as observations, its scorer as the reward."""

import gymnasium as gym
import pytest

import envs  # noqa: F401


def test_question_is_fixed_by_the_seed_and_scored_by_the_dataset():
    import reasoning_gym

    env = gym.make("starpo/ReasoningGym-v0", dataset="chain_sum")
    obs, _ = env.reset(seed=3)
    expected = reasoning_gym.create_dataset("chain_sum", seed=3, size=1)[0]
    assert obs == expected["question"] and env.reset(seed=3)[0] == obs and env.reset(seed=4)[0] != obs
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step(f" {expected['answer']} ")
    assert reward == 1.0 and terminated and info["success"]
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step("-1")
    assert reward == 0.0 and terminated and not info["success"]  # one attempt by default


def test_multi_attempt_feedback_then_success():
    env = gym.make(
        "starpo/ReasoningGym-v0", dataset="chain_sum", config={"min_terms": 2, "max_terms": 2}, max_attempts=3
    )
    question, _ = env.reset(seed=7)
    obs, reward, terminated, _, info = env.step("not a number")
    assert not terminated and reward == 0.0 and obs == "Not correct (score 0). Attempt 2 of 3. " + question
    obs, reward, terminated, _, info = env.step(env.unwrapped.expert_action())
    assert terminated and reward == 1.0 and info["success"]
    env.reset(seed=7)
    for _ in range(3):
        _, _, terminated, _, info = env.step("")
    assert terminated and not info["action_is_valid"]  # an empty answer is invalid, and the attempts run out


def test_bad_dataset_or_config_is_refused_with_the_dataset_named():
    with pytest.raises(ValueError, match="no dataset 'nope'"):
        gym.make("starpo/ReasoningGym-v0", dataset="nope")
    with pytest.raises(TypeError, match="bogus"):
        gym.make("starpo/ReasoningGym-v0", dataset="chain_sum", config={"bogus": 1})
    with pytest.raises(ValueError, match="max_attempts"):
        gym.make("starpo/ReasoningGym-v0", max_attempts=0)
