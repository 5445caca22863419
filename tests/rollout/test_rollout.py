import copy
import pathlib

import gymnasium as gym
import pytest
import torch
import trl
from conftest import assert_logprobs_match_a_forward_pass, env_spans
from hypothesis import given, settings
from hypothesis import strategies as st

from starpo_trl.rollout import ChatFormat, HFBackend, RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.hf_backend import CACHE_KEY
from starpo_trl.rollout.prompting import parse_reply

TEMPLATES = pathlib.Path(trl.__file__).parent / "chat_templates"


def engine(tokenizer, backend, **cfg):
    return RolloutEngine(tokenizer, backend, RolloutConfig(**cfg), [tokenizer.eos_token_id])


def sokoban_starts(n_states=2, group=3):
    return [StartState("starpo/Sokoban-v0", s) for s in range(n_states) for _ in range(group)]


def test_sampling_logprobs_are_reproduced_by_a_forward_pass(tiny_tokenizer, tiny_model):
    torch.manual_seed(0)
    backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
    eps = engine(tiny_tokenizer, backend, max_turns=3, max_tokens_per_turn=12, temperature=0.7).run(sokoban_starts())
    for ep in eps:
        assert ep.num_turns == 3 and len(ep.completion_ids) == len(ep.env_mask) == len(ep.logprobs)
        assert_logprobs_match_a_forward_pass(tiny_model, ep, temperature=0.7)


def test_env_spans_decode_to_exactly_the_rendered_messages(tiny_tokenizer, scripted):
    backend = scripted("<think>push</think><answer>Up || Left</answer>")
    eps = engine(tiny_tokenizer, backend, max_turns=3).run(sokoban_starts(1, 2))
    for ep in eps:
        spans = env_spans(ep)
        user_messages = [m["content"] for m in ep.messages if m["role"] == "user"][1:]
        assert len(spans) == len(user_messages) == ep.num_turns - 1
        for (a, b), content in zip(spans, user_messages):
            text = tiny_tokenizer.decode(ep.completion_ids[a:b])
            assert text == f"\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
            assert "State:" in content
        # each turn ends on a model token, right before an env span or at the end
        for pos in ep.turn_end_positions:
            assert ep.env_mask[pos] == 1 and (pos + 1 == len(ep.env_mask) or ep.env_mask[pos + 1] == 0)
        # the model's tokens are the reply, verbatim, once per turn
        model_ids = [t for t, m in zip(ep.completion_ids, ep.env_mask) if m == 1]
        reply = tiny_tokenizer("<think>push</think><answer>Up || Left</answer>", add_special_tokens=False)["input_ids"]
        assert model_ids == (reply + [tiny_tokenizer.eos_token_id]) * ep.num_turns


def test_one_batched_generate_call_per_turn(tiny_tokenizer, scripted):
    backend = scripted("<think>x</think><answer>Up</answer>")
    eps = engine(tiny_tokenizer, backend, max_turns=4).run(sokoban_starts(3, 4))
    assert len(backend.calls) == max(ep.num_turns for ep in eps)
    assert backend.calls[0] == 12


def test_actions_rewards_and_budgets(tiny_tokenizer, scripted):
    # 7 actions in one reply: only max_actions_per_turn=5 run; the episode budget (6) stops turn 2 after 1
    backend = scripted("<think>x</think><answer>Up||Up||Up||Up||Up||Up||Up</answer>")
    eps = engine(tiny_tokenizer, backend, max_turns=5, max_actions_per_turn=5, max_actions_per_episode=6).run(
        [StartState("starpo/FrozenLake-v0", 0, (("is_slippery", False),))]
    )
    ep = eps[0]
    assert ep.num_actions == 6 and ep.num_turns == 2 and ep.done
    assert ep.num_valid_actions == 6 and ep.num_format_errors == 0


def test_bandit_rewards_and_format_penalty(tiny_tokenizer, scripted):
    import gymnasium as gym

    env = gym.make("starpo/Bandit-v0").unwrapped
    env.reset(seed=4)
    safe = env.action_names[1 - env.risky]
    eps = engine(tiny_tokenizer, scripted(f"<think>safe</think><answer>{safe}</answer>"), max_turns=1).run(
        [StartState("starpo/Bandit-v0", 4)]
    )
    assert eps[0].turn_rewards == [0.15] and not eps[0].success
    eps = engine(tiny_tokenizer, scripted("<answer>Dragon</answer>"), max_turns=2).run(
        [StartState("starpo/Bandit-v0", 4)]
    )
    assert eps[0].turn_rewards == [-0.1, -0.1] and eps[0].num_format_errors == 2


MALFORMED = [
    "no tags at all",
    "<think>x</think><answer></answer>",
    "<think>x</think><answer>" + "||".join(["Up"] * 1000) + "</answer>",
    "<think>\x00\x1b[31m\u202e\U0001f600</think><answer>\ud7ff||Ǔp||UP</answer>",
    "<think><think></think><answer><answer>Up</answer></answer></think>",
    "<|im_end|><|im_start|>user\nfake</answer>",
]


@pytest.mark.parametrize("reply", MALFORMED)
def test_malformed_output_is_a_format_penalty_never_a_crash(tiny_tokenizer, scripted, reply):
    for env_id in ("starpo/Sokoban-v0", "starpo/Countdown-v0", "starpo/Bandit-v0"):
        eps = engine(tiny_tokenizer, scripted(reply), max_turns=2).run([StartState(env_id, 0)])
        ep = eps[0]
        parsed = parse_reply(
            tiny_tokenizer.decode(
                tiny_tokenizer(reply, add_special_tokens=False)["input_ids"], skip_special_tokens=True
            )
        )
        if not parsed.format_ok:
            assert ep.num_format_errors == ep.num_turns and ep.turn_rewards[0] == pytest.approx(-0.1)
        assert len(ep.completion_ids) == len(ep.env_mask) == len(ep.logprobs)


def test_episode_token_cap_cuts_at_a_turn_boundary(tiny_tokenizer, scripted):
    reply = "<think>thinking hard</think><answer>Left</answer>"
    full = engine(tiny_tokenizer, scripted(reply), max_turns=5).run([StartState("starpo/Sokoban-v0", 1)])[0]
    cap = full.turn_end_positions[1] + 5  # room for two turns, not for the third's observation
    ep = engine(tiny_tokenizer, scripted(reply), max_turns=5, max_episode_tokens=cap).run(
        [StartState("starpo/Sokoban-v0", 1)]
    )[0]
    assert ep.truncated and ep.num_turns == 2
    assert ep.completion_ids == full.completion_ids[: full.turn_end_positions[1] + 1]
    assert ep.env_mask == full.env_mask[: len(ep.completion_ids)] and ep.env_mask[-1] == 1


def test_per_turn_token_cap_closes_the_turn_with_an_env_token(tiny_tokenizer, scripted):
    ep = engine(tiny_tokenizer, scripted("<think>" + "a " * 50), max_turns=2, max_tokens_per_turn=8).run(
        [StartState("starpo/Sokoban-v0", 1)]
    )[0]
    first_env = ep.env_mask.index(0)
    assert first_env == 8 and ep.completion_ids[first_env] == tiny_tokenizer.eos_token_id


def _template_tokenizer(tiny_tokenizer, name, extra_special=()):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = (TEMPLATES / name).read_text()
    if extra_special:
        tok.add_special_tokens({"bos_token": extra_special[0], "additional_special_tokens": list(extra_special[1:])})
    return tok


@pytest.mark.parametrize(
    "name,eos,special",
    [
        ("qwen2_5.jinja", "<|im_end|>", ()),
        ("qwen3.jinja", "<|im_end|>", ()),
        (
            "llama3.jinja",
            "<|eot_id|>",
            ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        ),
    ],
)
def test_real_chat_templates_work(tiny_tokenizer, name, eos, special):
    tok = _template_tokenizer(tiny_tokenizer, name, special)
    eos_id = tok.convert_tokens_to_ids(eos)
    from tests.conftest import ScriptedBackend

    backend = ScriptedBackend(tok, "<think>x</think><answer>Up</answer>", eos_id)
    eps = RolloutEngine(tok, backend, RolloutConfig(max_turns=3), [eos_id]).run([StartState("starpo/Sokoban-v0", 2)])
    ep = eps[0]
    assert ep.num_turns == 3
    for (a, b), msg in zip(env_spans(ep), [m for m in ep.messages if m["role"] == "user"][1:]):
        assert msg["content"] in tok.decode(ep.completion_ids[a:b])


def test_non_prefix_preserving_template_is_refused(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    # drops every assistant message but the last: history would change under the model's feet
    tok.chat_template = (
        "{%- for m in messages %}{%- if m['role'] != 'assistant' or loop.last %}"
        "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    with pytest.raises(ValueError, match="prefix-preserving"):
        ChatFormat(tok, [tok.eos_token_id])


def test_env_that_raises_ends_only_its_episode(tiny_tokenizer, scripted, monkeypatch):
    from envs.sokoban import SokobanEnv

    real_step = SokobanEnv.step

    def flaky(self, action):
        if self.steps >= 1 and self.player[1] % 2 == 0:
            raise RuntimeError("boom")
        return real_step(self, action)

    monkeypatch.setattr(SokobanEnv, "step", flaky)
    eps = engine(tiny_tokenizer, scripted("<think>x</think><answer>Left||Right</answer>"), max_turns=3).run(
        [StartState("starpo/Sokoban-v0", s) for s in range(6)]
    )
    errored = [ep for ep in eps if ep.env_error]
    assert errored and all("boom" in ep.env_error and ep.done for ep in errored)


def test_reply_parsing_is_linear_in_the_reply_length():
    import time

    for reply in (
        "<think></think><answer>" * 45_000,
        "<think><answer></think>" * 45_000,
        "<answer>" * 120_000,
        "</think>" * 120_000,
    ):
        assert len(reply) >= 960_000
        for think in (True, False):
            seconds = []
            for _ in range(3):  # best of three: the machine is shared
                t0 = time.perf_counter()
                parsed = parse_reply(reply, enable_think=think)
                seconds.append(time.perf_counter() - t0)
            assert min(seconds) < 0.05
            assert not parsed.format_ok


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "\xa0", "\x1c", "a", "Up", "||"]),
        max_size=14,
    )
)
def test_linear_parser_finds_what_the_regex_finds(parts):
    import re

    from starpo_trl.rollout.prompting import _find_answer, _find_think_answer

    text = "".join(parts)
    m = re.search(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", text, re.DOTALL)
    assert _find_think_answer(text) == (None if m is None else (m.group(1), m.group(2)))
    m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert _find_answer(text) == (None if m is None else m.group(1))


def test_sampling_ignores_the_checkpoints_own_generation_settings(tiny_tokenizer, tiny_model):
    """Tokens come from softmax(logits / T), whatever the checkpoint's generation_config sets: the
    recorded logprobs (and TRL's loss) are that distribution's."""

    def play(model):
        torch.manual_seed(0)
        backend = HFBackend(model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
        return engine(tiny_tokenizer, backend, max_turns=2, max_tokens_per_turn=16, temperature=0.7).run(
            sokoban_starts(2, 2)
        )

    clean = play(tiny_model)
    opinionated = copy.deepcopy(tiny_model)
    gc = opinionated.generation_config
    gc.repetition_penalty, gc.top_k, gc.top_p, gc.temperature, gc.no_repeat_ngram_size = 1.5, 3, 0.3, 0.2, 2
    gc.do_sample = True
    processed = play(opinionated)
    assert [ep.completion_ids for ep in processed] == [ep.completion_ids for ep in clean]
    assert [ep.logprobs for ep in processed] == [ep.logprobs for ep in clean]
    assert opinionated.generation_config.repetition_penalty == 1.5  # the model's own config is left as it was
    # and those settings would have changed the draw: the test can fail
    torch.manual_seed(0)
    ids = torch.tensor([clean[0].prompt_ids])
    out = opinionated.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, pad_token_id=tiny_tokenizer.pad_token_id
    )
    assert out[0, ids.shape[1] :].tolist() != clean[0].completion_ids[:16]


class ByEnvBackend:
    """Sokoban episodes get a long reply, others a medium one (decided from the conversation itself,
    so a reply does not depend on the batch's order)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []
        eos = [tokenizer.eos_token_id]
        self.long = (
            tokenizer("<think>" + "push " * 30 + "</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
            + eos
        )
        self.medium = (
            tokenizer("<think>" + "go " * 22 + "</think><answer>Right</answer>", add_special_tokens=False)["input_ids"]
            + eos
        )

    def generate(self, sequences, max_new_tokens, temperature):
        self.calls.append((len(sequences), max_new_tokens))
        out = []
        for seq in sequences:
            ids = self.long if "Sokoban" in self.tokenizer.decode(seq[:200]) else self.medium
            out.append((ids[:max_new_tokens], [-1.0] * min(len(ids), max_new_tokens)))
        return out


def test_an_episode_is_limited_by_its_own_token_room_only(tiny_tokenizer):
    cfg = dict(max_turns=5, max_tokens_per_turn=64, max_episode_tokens=230)
    lake = StartState("starpo/FrozenLake-v0", 0, (("is_slippery", False),))
    alone = engine(tiny_tokenizer, ByEnvBackend(tiny_tokenizer), **cfg).run([lake])[0]
    backend = ByEnvBackend(tiny_tokenizer)
    shared = engine(tiny_tokenizer, backend, **cfg).run([StartState("starpo/Sokoban-v0", 0), lake])
    # the Sokoban episode runs out of room at turn 3 (its reply is cut there), while the lake's is not
    assert len(shared[0].completion_ids) == 230 and shared[0].num_format_errors == 1
    assert shared[1].completion_ids == alone.completion_ids and shared[1].env_mask == alone.env_mask
    assert shared[1].num_format_errors == alone.num_format_errors == 0


def test_kv_reuse_across_turns_gives_the_same_tokens_and_logprobs(tiny_tokenizer, tiny_model):
    """With reuse each turn feeds only its new tokens (the reply's last token and the observation);
    the episodes are the ones a full re-read of the history gives."""

    def play(reuse):
        torch.manual_seed(0)
        backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id], reuse_cache=reuse)
        eng = engine(tiny_tokenizer, backend, max_turns=4, max_tokens_per_turn=12, temperature=0.7)
        return eng.run(sokoban_starts(3, 2)), backend

    full, full_backend = play(False)
    reused, backend = play(True)
    assert backend.reuse_cache and [ep.completion_ids for ep in reused] == [ep.completion_ids for ep in full]
    for a, b in zip(reused, full):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
        assert_logprobs_match_a_forward_pass(tiny_model, a, temperature=0.7)
    # prefill: the first turn reads each distinct prompt once (the copies of a start state share it,
    # each feeding only its last token), later turns only what was appended
    distinct = {tuple(ep.prompt_ids) for ep in reused}
    assert len(distinct) == 3 and len(reused) == 6
    first_turn = sum(len(p) - 1 for p in distinct) + len(reused)
    appended = sum(len(ep.completion_ids) for ep in reused)
    assert backend.prefill_tokens < full_backend.prefill_tokens / 2
    assert first_turn <= backend.prefill_tokens <= first_turn + appended
    assert full_backend.prefill_tokens >= sum(len(ep.prompt_ids) for ep in full)  # no sharing without reuse
    # a new rollout starts from nothing: the engine resets the backend's kept state
    again = engine(tiny_tokenizer, backend, max_turns=1, max_tokens_per_turn=4).run(sokoban_starts(1, 1))
    assert (
        again
        and backend._kept
        and all(len(t) == len(again[0].prompt_ids) + len(again[0].completion_ids) - 1 for t, _ in backend._kept)
    )


def test_finished_rows_leave_the_batch_and_replies_stay_exact(tiny_tokenizer, tiny_model):
    """With ``drop_finished_rows`` a call ends once a quarter of its rows are done and the others go on in a new call from
    their kept cache: greedy replies are the ones one call gives (and a full re-read), decode work counted by hand,
    sampled replies' logprobs equal a forward pass, and the next turn reads every row's cache, wherever it ended."""
    from types import SimpleNamespace

    texts = ["The lake is frozen.", "Push the box onto the target", "A", "Two arms: Tiger pays 1.0, Crane pays 0.15"]
    sequences = [tiny_tokenizer(t)["input_ids"] for t in texts]
    limits = [2, 3, 8, 12]  # no end-of-turn token: each row ends at its limit (row 3 at the call's)
    done = lambda i, ids: len(ids) >= limits[i]  # noqa: E731

    def backend(**kw):
        return HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [], **kw)

    def two_turns(b, temperature):
        first = b.generate(sequences, 12, temperature, done=done)
        follow = [seq + ids + tiny_tokenizer(" next")["input_ids"] for seq, (ids, _) in zip(sequences, first)]
        prefill = b.prefill_tokens
        second = b.generate(follow, 5, temperature, done=lambda i, ids: len(ids) >= 5)
        return first, second, b.prefill_tokens - prefill, follow

    dropping, whole, plain = backend(), backend(drop_finished_rows=False), backend(reuse_cache=False)
    got, want, reread = two_turns(dropping, 0.0), two_turns(whole, 0.0), two_turns(plain, 0.0)
    for a, b, c in zip(got[0] + got[1], want[0] + want[1], reread[0] + reread[1]):
        assert a[0] == b[0] == c[0]
        assert max(abs(x - y) for x, y in zip(a[1], b[1])) < 1e-5
    assert [len(ids) for ids, _ in got[0]] == limits
    # turn 1 (a call ends once a quarter of its rows, at least one, are done with 8 or more of its tokens left):
    # 4 rows x 2 steps (row 0 done, 10 left); rows 1-3 x 1 step (row 1 done at 3 tokens, 9 left); rows 2 and 3 for the
    # last 9 (row 2 is done at 8 tokens, with 4 left: too few to end the call). One call alone: 4 rows x 12 steps.
    # Turn 2: 4 rows x 5 steps, fewer than 8 tokens in all
    assert dropping.row_steps == 4 * 2 + 3 * 1 + 2 * 9 + 4 * 5 and whole.row_steps == 4 * 12 + 4 * 5
    assert dropping.decode_steps == whole.decode_steps == 12 + 5
    assert dropping.reply_tokens == whole.reply_tokens == sum(limits) + 4 * 5
    # the token a continued row feeds is a decode step, not prefill; turn 2 reads only each row's reply's last token
    # and " next", rows 0, 1 and 2 from the cache of the call they ended in
    new = len(tiny_tokenizer(" next")["input_ids"])
    assert got[2] == want[2] == 4 * (1 + new)
    assert dropping.prefill_tokens == whole.prefill_tokens == sum(map(len, sequences)) + 4 * (1 + new)
    torch.manual_seed(1)
    first, second, _, follow = two_turns(backend(), 1.0)
    for seq, (ids, lps) in [*zip(sequences, first), *zip(follow, second)]:
        ep = SimpleNamespace(prompt_ids=seq, completion_ids=ids, env_mask=[1] * len(ids), logprobs=lps)
        assert_logprobs_match_a_forward_pass(tiny_model, ep, temperature=1.0)


def test_kv_reuse_holds_the_cache_once(tiny_tokenizer, tiny_model, monkeypatch):
    """While a turn samples, the kept rows live only in the cache given to ``generate`` (not also in
    the backend); once copied back per row, the sampling cache's layers are released."""
    backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
    seen, caches = [], []
    real = tiny_model.generate

    def spy(*args, **kwargs):
        seen.append((len(backend._kept), kwargs.get(CACHE_KEY) is not None))
        out = real(*args, **kwargs)
        caches.append(out[CACHE_KEY])
        return out

    monkeypatch.setattr(tiny_model, "generate", spy)
    torch.manual_seed(0)
    episodes = engine(tiny_tokenizer, backend, max_turns=3, max_tokens_per_turn=8).run(sokoban_starts(2, 2))
    assert max(ep.num_turns for ep in episodes) == 3
    # turn 1 starts from the shared prompts' cache, turns 2 and 3 from the kept rows: each a cache
    # the backend itself no longer holds
    assert seen == [(0, True)] * 3
    assert all(layer.keys is None and layer.key_buffer is None for cache in caches for layer in cache.layers)
    assert all(layer.values is None and layer.value_buffer is None for cache in caches for layer in cache.layers)
    assert backend._kept and all(k.is_contiguous() for _, rows in backend._kept for k, _ in rows)


def test_the_sampling_cache_is_allocated_once_per_call_and_samples_as_a_dynamic_cache(
    tiny_tokenizer, tiny_model, monkeypatch
):
    """Each call's cache is allocated once for history + new tokens + the token limit and written in
    place (no copy of the cache per sampled token); the draws are those of transformers' own
    ``DynamicLayer``, which concatenates."""
    from experiments.real_model import ConcatenatingLayer
    from starpo_trl.rollout import hf_backend

    def play(layer_class):
        monkeypatch.setattr(hf_backend, "_CallLayer", layer_class)
        torch.manual_seed(0)
        backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
        return engine(tiny_tokenizer, backend, max_turns=3, max_tokens_per_turn=10, temperature=0.7).run(
            sokoban_starts(2, 2)
        )

    real, storages, capacities, made = hf_backend._CallLayer, set(), set(), []

    class Watched(real):
        def __init__(self, capacity):
            super().__init__(capacity)
            made.append(self)
            self.serial = len(made)

        def update(self, key_states, value_states, *args, **kwargs):
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            storages.add((self.serial, keys.untyped_storage().data_ptr(), values.untyped_storage().data_ptr()))
            capacities.add(self.capacity)
            return keys, values

    watched = play(Watched)
    layers = {layer for layer, _, _ in storages}
    # one storage per layer of each call, whatever the number of steps: 3 calls (turns)
    assert len(storages) == len(layers) == len(made) == 3 * tiny_model.config.num_hidden_layers
    assert max(capacities) <= 3 * 10 + max(len(ep.prompt_ids) + len(ep.completion_ids) for ep in watched)

    concatenated = play(ConcatenatingLayer)  # transformers' own layer, given the kept rows the same way
    assert [ep.completion_ids for ep in watched] == [ep.completion_ids for ep in concatenated]
    for a, b in zip(watched, concatenated):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-6
        assert_logprobs_match_a_forward_pass(tiny_model, a, temperature=0.7)


def test_the_sampling_cache_refuses_more_positions_than_it_was_allocated():
    from starpo_trl.rollout.hf_backend import _CallLayer

    layer = _CallLayer(4)
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2)
    out, _ = layer.update(keys, keys + 100)
    assert torch.equal(out, keys) and layer.key_buffer.shape == (2, 1, 4, 2)
    with pytest.raises(RuntimeError, match="cache of 4 positions asked for 6"):
        layer.update(keys[:, :, :3], keys[:, :, :3])
    assert layer.length == 3  # nothing written past the room


def test_other_attention_layouts_get_the_cache_their_config_asks_for(tiny_tokenizer, tiny_model, monkeypatch):
    """A model with sliding-window or linear-attention layers is not given the backend's full-length
    cache (nor KV reuse): ``generate`` builds the cache from the model's config, as without the backend."""
    from starpo_trl.rollout import hf_backend

    monkeypatch.setattr(hf_backend, "_full_attention", lambda model: False)
    backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
    given, real = [], tiny_model.generate

    def spy(*args, **kwargs):
        given.append(kwargs.get("cache"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny_model, "generate", spy)
    torch.manual_seed(0)
    episodes = engine(tiny_tokenizer, backend, max_turns=2, max_tokens_per_turn=8).run(sokoban_starts(1, 2))
    assert not backend.reuse_cache and given and all(cache is None for cache in given)
    for ep in episodes:
        assert_logprobs_match_a_forward_pass(tiny_model, ep, temperature=1.0)


def test_the_backend_is_given_per_run_and_timings_come_back_with_the_episodes(tiny_tokenizer, scripted):
    """The engine keeps no per-run state: the backend can change between runs (as the trainer's
    does with new weights), and each run returns its own timings."""
    from starpo_trl.rollout import Rollout

    eng = RolloutEngine(tiny_tokenizer, None, RolloutConfig(max_turns=1), [tiny_tokenizer.eos_token_id])
    with pytest.raises(ValueError, match="backend"):
        eng.run([StartState("starpo/Bandit-v0", 4)])
    safe = "Dragon" if "Dragon: pays 0.15" in str(gym.make("starpo/Bandit-v0").reset(seed=4)[0]) else "Phoenix"
    first = eng.run([StartState("starpo/Bandit-v0", 4)], backend=scripted(f"<think>x</think><answer>{safe}</answer>"))
    second = eng.run([StartState("starpo/Bandit-v0", 4)], backend=scripted("<answer>nonsense</answer>"))
    assert isinstance(first, Rollout) and set(first.timings) == {"generate", "env"} and first.timings["generate"] >= 0
    assert first[0].num_format_errors == 0 and second[0].num_format_errors == 1
    assert first.timings is not second.timings
    assert not hasattr(eng, "timings") and not hasattr(eng, "progress")


def test_the_cache_argument_name_is_the_installed_transformers_one():
    """transformers 5.24 renamed ``past_key_values`` to ``cache``; the pinned range spans both."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    assert CACHE_KEY in CausalLMOutputWithPast.__dataclass_fields__
