"""Hostile model output: parsing, action splitting and every env step never raise."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envs
from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.prompting import parse_reply

SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "||",
    "<|eot_id|>",
]
pieces = st.one_of(
    st.text(max_size=40), st.sampled_from(SPECIAL + ["Up", "left", "Dragon", "1 + 2", "\x00", "\u202e", "🙂"])
)
hostile = st.lists(pieces, max_size=30).map("".join)


@settings(max_examples=400, deadline=None)
@given(hostile)
def test_parse_reply_never_raises(text):
    for think in (True, False):
        parsed = parse_reply(text, enable_think=think, max_actions=5)
        assert len(parsed.actions) <= 5
        assert parsed.format_ok == bool(parsed.actions)
        assert all(a and a == a.strip() for a in parsed.actions)


def test_huge_and_pathological_replies():
    megabyte = "<think>x</think><answer>" + "Up||" * 250_000 + "</answer>"
    parsed = parse_reply(megabyte, max_actions=5)
    assert not parsed.format_ok  # an answer over 4096 characters is malformed, not 250k actions
    nested = "<think>" * 10_000 + "</think>" * 10_000 + "<answer>Up</answer>"
    assert parse_reply(nested).actions == ["Up"]
    assert parse_reply("<think></think><answer>" + "||" * 1000 + "</answer>").format_ok is False


@pytest.fixture(scope="module")
def engines(tiny_tokenizer):
    class Replay:
        text = ""

        def generate(self, sequences, max_new_tokens, temperature):
            ids = tiny_tokenizer(self.text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            return [(list(ids), [-1.0] * len(ids)) for _ in sequences]

    backend = Replay()
    engine = RolloutEngine(
        tiny_tokenizer, backend, RolloutConfig(max_turns=2, max_tokens_per_turn=64), [tiny_tokenizer.eos_token_id]
    )
    return engine, backend


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hostile)
def test_every_env_survives_hostile_replies(engines, text):
    engine, backend = engines
    backend.text = text
    episodes = engine.run([StartState(env_id, 3) for env_id in envs.ENV_IDS])
    for ep in episodes:
        assert ep.env_error is None, ep.env_error
        assert len(ep.completion_ids) == len(ep.env_mask) == len(ep.logprobs)
        assert ep.num_format_errors <= ep.num_turns and ep.num_valid_actions <= ep.num_actions
        decoded = engine.tokenizer.decode(ep.completion_ids[: ep.turn_end_positions[0] + 1], skip_special_tokens=True)
        if not parse_reply(decoded).format_ok:
            # nothing was executed in that turn: its reward is exactly the format penalty
            assert ep.num_format_errors >= 1 and ep.turn_rewards[0] == pytest.approx(-0.1)
