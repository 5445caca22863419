"""The vLLM backend's contract, on CPU with a stand-in for TRL's VLLMGeneration (vLLM itself needs a GPU)."""

import math

import pytest
import torch

from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.vllm_backend import VLLMBackend, vllm_importance_sampling_ratio


class FakeGeneration:
    """Answers like TRL's VLLMGeneration.generate: ids and top-k logprob lists (sampled token first)."""

    def __init__(self, tokenizer, text):
        self.tokenizer, self.text = tokenizer, text
        self.max_completion_length, self.temperature = 16, 1.0
        self.calls = []

    def generate(self, prompts, images, num_generations):
        self.calls.append((len(prompts), self.max_completion_length, self.temperature))
        ids = self.tokenizer(self.text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id, 5, 6]
        ids = ids[: self.max_completion_length]
        logprobs = [[-0.5 - 0.01 * t, -9.0] for t in range(len(ids))]
        return prompts, [ids] * len(prompts), [logprobs] * len(prompts), None


class FakeAccelerator:
    """Two processes: the other one holds ``other`` prompts."""

    num_processes = 2

    def __init__(self, other):
        self.other = other


def test_backend_takes_sampled_logprobs_cuts_at_eos_and_restores_settings(tiny_tokenizer):
    gen = FakeGeneration(tiny_tokenizer, "<answer>Left</answer>")
    backend = VLLMBackend(gen, [tiny_tokenizer.eos_token_id], None, tiny_tokenizer.pad_token_id)
    out = backend.generate([[1, 2, 3], [4, 5]], max_new_tokens=40, temperature=0.7)
    n = len(tiny_tokenizer("<answer>Left</answer>", add_special_tokens=False)["input_ids"]) + 1
    assert [len(ids) for ids, _ in out] == [n, n] and out[0][0][-1] == tiny_tokenizer.eos_token_id
    assert out[0][1] == pytest.approx(
        [-0.5 - 0.01 * t for t in range(n)]
    )  # the sampled token's logprob, not the top-k
    assert gen.calls == [(2, 40, 0.7)]
    assert (gen.max_completion_length, gen.temperature) == (16, 1.0)  # TRL's own settings are put back


def test_backend_pads_to_the_largest_process_and_joins_calls_with_no_prompts(tiny_tokenizer, monkeypatch):
    import accelerate.utils

    gen = FakeGeneration(tiny_tokenizer, "<answer>Up</answer>")
    backend = VLLMBackend(gen, [tiny_tokenizer.eos_token_id], FakeAccelerator(other=5), tiny_tokenizer.pad_token_id)
    # this process is rank 0 with 2 prompts and cap 12; the other has 5 prompts and cap 30
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda obj: obj + [(5, 30)])
    out = backend.generate([[1], [2]], max_new_tokens=12, temperature=1.0)
    assert len(out) == 2 and gen.calls[-1] == (5, 30, 1.0)  # padded to 5 prompts, the largest cap
    out = backend.generate([], max_new_tokens=0, temperature=1.0)
    assert out == [] and gen.calls[-1] == (5, 30, 1.0) and len(gen.calls) == 2  # still in the collective call
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda obj: obj + [(0, 0)])
    assert (
        backend.generate([], max_new_tokens=0, temperature=1.0) == [] and len(gen.calls) == 2
    )  # nobody active: no call


def test_engine_keeps_a_collective_backend_in_step_until_max_turns(tiny_tokenizer, monkeypatch):
    import accelerate.utils

    gen = FakeGeneration(tiny_tokenizer, "<answer>Left</answer>")
    cfg = RolloutConfig(max_turns=4, enable_think=False, max_actions_per_episode=2, max_actions_per_turn=1)
    starts = [StartState("starpo/FrozenLake-v0", s) for s in range(3)]
    # one process: no call once nobody is active
    backend = VLLMBackend(gen, [tiny_tokenizer.eos_token_id], None, tiny_tokenizer.pad_token_id)
    eps = RolloutEngine(tiny_tokenizer, backend, cfg, [tiny_tokenizer.eos_token_id]).run(starts)
    assert all(ep.num_turns == 2 for ep in eps)  # two actions per episode, one per turn
    assert len(gen.calls) == 2
    # two processes, the other one still playing: this one joins every turn up to max_turns
    gen.calls.clear()
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda obj: obj + [(1, 8)])
    backend = VLLMBackend(gen, [tiny_tokenizer.eos_token_id], FakeAccelerator(other=1), tiny_tokenizer.pad_token_id)
    eps = RolloutEngine(tiny_tokenizer, backend, cfg, [tiny_tokenizer.eos_token_id]).run(starts)
    assert len(gen.calls) == 4 and [c[0] for c in gen.calls] == [3, 3, 1, 1]
    ep = eps[0]  # sampling logprobs on model tokens, 0.0 on env tokens
    assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.env_mask) if m == 0)
    first_turn = ep.turn_end_positions[0] + 1
    assert ep.logprobs[:first_turn] == pytest.approx([-0.5 - 0.01 * t for t in range(first_turn)])


def test_importance_sampling_ratio_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    sampling = torch.tensor([[-1.5, -1.0, -0.5, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is an env token
    # differences 0.5, -1.0, 0.0, (masked) 0
    token = vllm_importance_sampling_ratio(old, sampling, mask, "token_truncate", None, 1.5)
    assert token.tolist()[0] == pytest.approx([1.5, math.exp(-1.0), 1.0, 1.0])  # e^0.5 = 1.65 clamped to 1.5
    masked = vllm_importance_sampling_ratio(old, sampling, mask, "token_mask", 0.5, 1.5)
    assert masked.tolist()[0] == pytest.approx([0.0, 0.0, 1.0, 1.0])  # e^-1 = 0.37 < 0.5 and 1.65 > 1.5 masked out
    seq = vllm_importance_sampling_ratio(old, sampling, mask, "sequence_truncate", None, 3.0)
    assert seq.shape == (1, 1) and seq.item() == pytest.approx(math.exp(-0.5))
    nan = vllm_importance_sampling_ratio(old, torch.full_like(old, float("nan")), mask, "token_truncate", None, 3.0)
    assert nan.tolist()[0] == [1.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        vllm_importance_sampling_ratio(old, sampling, mask, "token_clip")


class FakeEngine:
    """What sync_weights touches of TRL's VLLMGeneration and vLLM's LLM."""

    def __init__(self, mode):
        from types import SimpleNamespace

        self.mode, self.events = mode, []
        runner = SimpleNamespace(
            reload_weights=lambda weights_iterator: self.events.append(("reload", weights_iterator))
        )
        worker = SimpleNamespace(model_runner=runner)
        self.llm = SimpleNamespace(
            llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker)),
            reset_prefix_cache=lambda: self.events.append(("reset",)),
        )

    def _iter_named_params(self):
        yield from [("a.weight", 1), ("b.weight", 2)]

    def sync_weights(self):
        self.events.append(("trl",))


@pytest.mark.parametrize(
    "mode, on_cpu, events",
    [
        ("colocate", True, [("reload", [("a.weight", 1), ("b.weight", 2)]), ("reset",)]),
        ("colocate", False, [("trl",)]),
        ("server", True, [("trl",)]),
    ],
)
def test_weights_reach_a_cpu_engine_by_vllms_reload_and_others_by_trls_sync(monkeypatch, mode, on_cpu, events):
    from starpo_trl.rollout import vllm_backend

    monkeypatch.setattr(vllm_backend, "_engine_on_cpu", lambda: on_cpu)
    engine = FakeEngine(mode)
    vllm_backend.sync_weights(engine)
    assert engine.events == events
