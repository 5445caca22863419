"""Reasoning-aware reward shaping: hand-worked per-turn rewards, the user hook, success untouched."""

import pytest

from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.settings import RolloutSettings
from starpo_trl.rollout.shaping import think_reward


def test_think_reward_by_hand():
    s = RolloutSettings(think_bonus=0.1, think_min_words=2, think_max_words=4, think_copy_penalty=0.3)
    assert think_reward("go left now", None, s) == pytest.approx(0.1)
    assert think_reward("left", None, s) == 0.0  # too short
    assert think_reward("one two three four five", None, s) == 0.0  # too long
    assert think_reward("", None, s) == 0.0 and think_reward(None, None, s) == 0.0
    assert think_reward("go  left now", "go left\nnow", s) == pytest.approx(
        0.1 - 0.3
    )  # verbatim copy, whitespace aside
    assert think_reward("go right now", "go left now", s) == pytest.approx(0.1)
    assert not RolloutSettings().shapes_think and s.shapes_think


def engine(tokenizer, backend, shaping=None, hook=None):
    cfg = RolloutConfig(
        max_turns=3,
        max_actions_per_turn=1,
        max_tokens_per_turn=40,
        format_penalty=-0.1,
        **(shaping or {}),
    )
    return RolloutEngine(tokenizer, backend, cfg, [tokenizer.eos_token_id], reasoning_reward_fn=hook)


def test_engine_adds_shaping_per_turn(tiny_tokenizer, scripted):
    # Sokoban: three turns of the same think; "Up" may or may not move, so compare with shaping off
    reply = "<think>push the box</think><answer>Up</answer>"
    start = [StartState("starpo/Sokoban-v0", 3)]
    plain = engine(tiny_tokenizer, scripted(reply)).run(start)[0]
    calls = []

    def hook(think, answer, previous, turn):
        calls.append((think, answer, previous, turn))
        return 0.01 * turn

    shaping = {"think_bonus": 0.1, "think_copy_penalty": 0.3}
    shaped = engine(tiny_tokenizer, scripted(reply), shaping, hook).run(start)[0]
    n = shaped.num_turns
    assert n == plain.num_turns and n >= 2
    # turn 1: +0.1 bonus + 0.01; turns 2..n: +0.1 - 0.3 (copy) + 0.01 * turn
    extra = [0.1 + 0.01] + [0.1 - 0.3 + 0.01 * t for t in range(2, n + 1)]
    assert shaped.turn_rewards == pytest.approx([r + e for r, e in zip(plain.turn_rewards, extra)])
    assert shaped.shaping_reward == pytest.approx(sum(extra))
    assert shaped.success == plain.success
    assert calls[0] == ("push the box", "Up", None, 1) and calls[1] == ("push the box", "Up", "push the box", 2)


def test_a_hook_returning_nan_is_a_clear_error(tiny_tokenizer, scripted):
    eng = engine(tiny_tokenizer, scripted("<think>a</think><answer>Up</answer>"), hook=lambda *a: float("nan"))
    with pytest.raises(ValueError, match="reasoning_reward_fn"):
        eng.run([StartState("starpo/Sokoban-v0", 3)])
