"""Overlong turns (overlong_turns: keep | mask | penalty): which replies are cut, to the token, and what each mode
does with them: the loss mask of the cut reply's tokens, or DAPO's soft penalty on that turn's reward."""

import pytest
import torch
from conftest import ScriptedBackend
from helpers import make_args

from starpo_trl.monitoring.metrics import rollout_metrics
from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.batch import episode_rows, episodes_to_tensors, trained_mask
from starpo_trl.rollout.engine import overlong_penalty

LAKE = StartState("starpo/FrozenLake-v0", 0, (("is_slippery", False), ("desc", ("SFF", "FFF", "FFG"))))
LONG = "<think>" + "go " * 40 + "</think><answer>Right</answer>"  # far past 12 tokens: cut
SHORT = "<think>go</think><answer>Down</answer>"  # ends with the end-of-turn token


def test_the_penalty_by_hand():
    """Budget 10, buffer 4: 0 up to 6 tokens, then -0.25 per token to -1 x factor at 10; no buffer: only at 10."""
    assert [overlong_penalty(n, 10, 4, 1.0) for n in (5, 6, 7, 8, 9, 10)] == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0]
    assert overlong_penalty(8, 10, 4, 0.5) == -0.25
    assert [overlong_penalty(n, 10, 0, 2.0) for n in (9, 10)] == [0.0, -2.0]


def play(tok, mode, replies, stop_strings=(), **kw):
    backend = ScriptedBackend(tok, lambda call, i: replies[call], tok.eos_token_id)
    cfg = RolloutConfig(
        max_turns=len(replies),
        max_tokens_per_turn=12,
        max_actions_per_turn=1,
        overlong_turns=mode,
        stop_strings=stop_strings,
        **kw,
    )
    (ep,) = RolloutEngine(tok, backend, cfg, [tok.eos_token_id]).run([LAKE])
    return ep


def test_a_reply_is_cut_only_when_it_reached_its_limit_without_an_end(tiny_tokenizer):
    tok = tiny_tokenizer
    ep = play(tok, "keep", [LONG, SHORT, LONG])
    assert ep.turn_cut == [True, False, True] and ep.masked_turns == []
    assert ep.turn_end_positions[0] - ep.reply_starts[0] + 1 == 12  # the cut reply holds its whole budget
    # a reply ended by a stop string at its last allowed token is not cut
    stopped = play(tok, "keep", ["<think>g</think><answer>Right</answer>"], stop_strings=["</answer>"])
    assert stopped.turn_cut == [False]
    # keep: the cut reply is trained like any other (its tokens in the loss, its reward untouched)
    assert trained_mask(ep) == ep.env_mask


def test_mask_leaves_exactly_the_cut_replies_out_of_the_loss(tiny_tokenizer):
    tok = tiny_tokenizer
    ep = play(tok, "mask", [LONG, SHORT, LONG])
    assert ep.masked_turns == [0, 2]
    mask = trained_mask(ep)
    assert len(mask) == len(ep.env_mask)
    for t, (a, b) in enumerate(zip(ep.reply_starts, ep.turn_end_positions)):
        want = 0 if t in (0, 2) else 1
        assert mask[a : b + 1] == [want] * (b + 1 - a), t
    assert [m for m, e in zip(mask, ep.env_mask) if e == 0] == [0] * ep.env_mask.count(0)  # env tokens as they were
    assert sum(mask) == ep.turn_end_positions[1] + 1 - ep.reply_starts[1]  # only the short reply trains
    batch = episodes_to_tensors([ep], tok.pad_token_id, "cpu")
    assert batch["tool_mask"][0, : len(mask)].tolist() == mask
    # with a context window: one row per turn, the cut turns' rows hold no trained token
    rows, _ = episode_rows([ep.__class__(**{**ep.__dict__, "turn_prompts": [[1], [1], [1]]})])
    assert [sum(trained_mask(r)) for r in rows] == [0, len(rows[1].completion_ids), 0]
    assert ep.turn_rewards == play(tok, "keep", [LONG, SHORT, LONG]).turn_rewards  # rewards unchanged


def test_penalty_subtracts_from_the_cut_turns_reward(tiny_tokenizer):
    tok = tiny_tokenizer
    keep = play(tok, "keep", [LONG, SHORT, LONG])
    pen = play(tok, "penalty", [LONG, SHORT, LONG], overlong_penalty_factor=0.5)
    assert [p - k for p, k in zip(pen.turn_rewards, keep.turn_rewards)] == pytest.approx([-0.5, 0.0, -0.5])
    assert trained_mask(pen) == pen.env_mask  # penalised, still trained on
    # with a buffer of 8 the short reply (its length n) is penalised by its share of the last 8 tokens
    ramp = play(tok, "penalty", [LONG, SHORT, LONG], overlong_buffer=8)
    n = ramp.turn_end_positions[1] + 1 - ramp.reply_starts[1]
    assert ramp.turn_rewards[1] - keep.turn_rewards[1] == pytest.approx(-min(1.0, max(0, n - 4) / 8))
    assert ramp.turn_rewards[0] - keep.turn_rewards[0] == pytest.approx(-1.0)


def test_the_share_of_cut_turns_is_logged_and_bad_settings_are_refused(tiny_tokenizer, tmp_path):
    ep = play(tiny_tokenizer, "keep", [LONG, SHORT, LONG])
    out, _ = rollout_metrics([ep], torch.tensor([ep.reward]), 1, 1, "FrozenLake-v0", {"generate": 0, "env": 0})
    assert out["rollout/cut_turn_fraction"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="overlong_turns must be keep, mask or penalty"):
        make_args(tmp_path, overlong_turns="drop")
    with pytest.raises(ValueError, match="overlong_buffer=20 is more than max_tokens_per_turn=12"):
        make_args(tmp_path, overlong_turns="penalty", overlong_buffer=20)
    assert make_args(tmp_path, overlong_turns="mask").overlong_turns == "mask"
