"""Adapter-only vLLM sync for LoRA (`vllm_lora_sync`), on CPU with stand-ins for vLLM and TRL's VLLMGeneration."""

import sys
import types

import pytest
import torch
from safetensors.torch import load_file

from starpo_trl import MultiTurnStarPOTrainer, StarPOConfig
from starpo_trl.env_configs import EnvConfig
from starpo_trl.rollout.lora_sync import AdapterSync, LoRALLM, lora_engine, lora_rank, max_lora_rank


class LoRARequest:  # vllm.lora.request.LoRARequest's positional signature: name, int id, path
    def __init__(self, lora_name, lora_int_id, lora_path):
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


@pytest.fixture
def fake_vllm(monkeypatch):
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    for name, module in (
        ("vllm", types.ModuleType("vllm")),
        ("vllm.lora", types.ModuleType("vllm.lora")),
        ("vllm.lora.request", request),
    ):
        monkeypatch.setitem(sys.modules, name, module)


class FakeLLM:
    """Answers ``generate`` with a fixed reply and records the adapter each call carried."""

    def __init__(self, reply_ids):
        self.reply_ids, self.requests, self.prefix_resets = reply_ids, [], 0

    def generate(self, prompts, sampling_params=None, use_tqdm=False, lora_request=None):
        self.requests.append(lora_request)
        return [list(self.reply_ids) for _ in prompts]

    def reset_prefix_cache(self):
        self.prefix_resets += 1


class FakeGeneration:
    """TRL's VLLMGeneration as far as the backend sees it: ``generate`` calls ``self.llm.generate``."""

    def __init__(self, llm):
        self.llm, self.max_completion_length, self.temperature = llm, 16, 1.0

    def generate(self, prompts, images, num_generations):
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=None, use_tqdm=False)
        logprobs = [[[-0.5] for _ in ids] for ids in outputs]
        return prompts, outputs, logprobs, None

    def sync_weights(self):
        raise AssertionError("with vllm_lora_sync the full weights must not be pushed")


def test_max_lora_rank_and_rank_lookup(policy_lora):
    assert [max_lora_rank(r) for r in (1, 8, 9, 32, 33, 512)] == [8, 8, 16, 32, 64, 512]
    with pytest.raises(ValueError, match="lower lora_r"):
        max_lora_rank(1024)
    assert lora_rank(policy_lora) == 4
    from peft import LoraConfig

    assert lora_rank("Qwen/Qwen2.5-0.5B-Instruct", LoraConfig(r=32)) == 32
    with pytest.raises(ValueError, match="needs a LoRA policy"):
        lora_rank("Qwen/Qwen2.5-0.5B-Instruct")


def test_lora_engine_builds_trls_llm_with_lora_support(monkeypatch):
    from trl.generation import vllm_generation

    made = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda **kw: made.append(kw) or "llm", raising=False)
    with lora_engine(12):
        vllm_generation.LLM(model="base", seed=0)
    vllm_generation.LLM(model="base", seed=0)  # outside: TRL's own arguments only
    assert made == [
        {"model": "base", "seed": 0, "enable_lora": True, "max_lora_rank": 16, "max_loras": 1},
        {"model": "base", "seed": 0},
    ]


def test_config_refuses_lora_sync_outside_colocate(tmp_path):
    base = dict(
        output_dir=str(tmp_path), env_id="starpo/Bandit-v0", num_start_states=2, num_generations=2, report_to=[]
    )
    with pytest.raises(ValueError, match="colocate"):
        StarPOConfig(**base, vllm_lora_sync=True)
    with pytest.raises(ValueError, match="colocate"):
        StarPOConfig(**base, vllm_lora_sync=True, use_vllm=True, vllm_mode="server")
    with pytest.raises(ValueError, match="sleep"):
        StarPOConfig(**base, vllm_lora_sync=True, use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True)
    with pytest.raises(ValueError, match="ZeRO-3 / FSDP shard"):  # the trainer passes sharded=ZeRO-3 or FSDP
        AdapterSync(None, None, sharded=True)


@pytest.fixture
def policy_lora(tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    from starpo_trl.tiny import build_tiny_model

    return get_peft_model(
        build_tiny_model(tiny_tokenizer, seed=3, hidden_size=32, num_layers=1),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )


def test_trainer_pushes_only_the_adapter_with_a_new_request_each_step(
    tmp_path, tiny_tokenizer, policy_lora, fake_vllm
):
    args = StarPOConfig(
        output_dir=str(tmp_path),
        env_id="starpo/Bandit-v0",
        max_turns=1,
        max_tokens_per_turn=12,
        num_start_states=2,
        num_generations=2,
        rollout_filter_ratio=1.0,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        learning_rate=1e-2,
    )
    trainer = MultiTurnStarPOTrainer(policy_lora, args, processing_class=tiny_tokenizer)
    reply = tiny_tokenizer("<think>x</think><answer>Dragon</answer>", add_special_tokens=False)["input_ids"] + [
        tiny_tokenizer.eos_token_id
    ]
    llm = FakeLLM(reply)
    trainer.use_vllm, trainer.vllm_generation = True, FakeGeneration(llm)  # vLLM itself needs a GPU
    trainer._last_loaded_step = -1  # as TRL sets it with use_vllm
    trainer.adapter_sync = AdapterSync(
        trainer.vllm_generation, trainer.accelerator.unwrap_model(trainer.model), str(tmp_path / "adapters")
    )
    assert isinstance(trainer.vllm_generation.llm, LoRALLM)

    def lora_weights():
        return {
            n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n and ".default." in n
        }

    seen = []
    for step in range(3):
        trainer.state.global_step = step
        before = lora_weights()
        episodes = trainer.play(EnvConfig("starpo/Bandit-v0").starts([0, 1]), 1.0)
        assert len(episodes) == 2 and episodes[0].completion_ids[: len(reply)] == reply
        request = llm.requests[-1]
        assert request is not None and request.lora_int_id == step + 1  # a new id per push: vLLM caches by id
        saved = load_file(f"{request.lora_path}/adapter_model.safetensors")
        assert len(saved) == len(before) > 0
        for name, tensor in saved.items():  # PEFT names without the adapter; the weights of this step
            match = [w for n, w in before.items() if n.replace(".default", "") == name]
            assert len(match) == 1 and torch.equal(match[0], tensor)
        seen.append(request.lora_path)
        trainer.play(EnvConfig("starpo/Bandit-v0").starts([0]), 1.0)  # same step: no new push
        assert llm.requests[-1] is request
        with torch.no_grad():  # stand-in for an optimizer step
            for p in trainer.model.parameters():
                if p.requires_grad:
                    p.add_(0.01)
    import os

    assert not os.path.exists(seen[0]) and os.path.exists(seen[1]) and os.path.exists(seen[2])  # the last two kept


def test_config_refuses_sleep_mode_on_cpu(tmp_path):
    """vLLM's CPU engine refuses sleep mode (tests/vllm_engine checks it against the real engine): refused here,
    before any model loads; with a GPU engine it is TRL's setting as it is."""
    from helpers import make_args

    with pytest.raises(ValueError, match="leave it off with use_cpu=True"):
        make_args(tmp_path, use_vllm=True, vllm_enable_sleep_mode=True, use_cpu=True)
    assert make_args(tmp_path, use_vllm=True, vllm_enable_sleep_mode=True).vllm_enable_sleep_mode
    assert make_args(tmp_path, vllm_enable_sleep_mode=True, use_cpu=True).use_cpu  # no vLLM: the setting is unused
