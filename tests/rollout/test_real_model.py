"""A real pretrained instruct model (SmolLM2-135M-Instruct, offline: starpo_trl.offline_model) through
the exact-token checks and one LoRA StarPO step: its own tokenizer, ChatML template with a default
system prompt, eos <|im_end|>. The model directory is built on first use (about 45 s)."""

import pytest
import torch
from conftest import assert_logprobs_match_a_forward_pass, env_spans

from starpo_trl.models import eos_token_ids
from starpo_trl.rollout import ChatFormat, HFBackend, RolloutConfig, RolloutEngine, StartState


@pytest.fixture(scope="session")
def smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from starpo_trl.offline_model import build

    path = build()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return path, tokenizer, model


def _engine(tokenizer, model, system_prompt="You are a helpful assistant.", **cfg):
    eos = eos_token_ids(tokenizer, model.generation_config.eos_token_id)
    backend = HFBackend(model, tokenizer.pad_token_id, eos)
    return RolloutEngine(tokenizer, backend, RolloutConfig(**cfg), eos, system_prompt=system_prompt)


def test_the_real_template_is_prefix_preserving_with_and_without_its_default_system_prompt(smollm2):
    _, tokenizer, model = smollm2
    assert tokenizer.convert_ids_to_tokens(eos_token_ids(tokenizer, model.generation_config.eos_token_id)) == [
        "<|im_end|>"
    ]
    for system in (None, "You are a helpful assistant."):
        chat = ChatFormat(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")], system)
        assert chat.chat_template is None  # the model's own template, not a replacement
        prompt = tokenizer.decode(chat.prompt_ids("hello"))
        default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
        assert (default in prompt) == (system is None) and prompt.endswith("<|im_start|>assistant\n")
        assert (
            tokenizer.decode(chat.message_ids({"role": "user", "content": "next"}))
            == "\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
        )


def test_real_model_episodes_are_exact_to_the_token(smollm2):
    """Sampling logprobs equal a forward pass over the whole episode; env spans decode to exactly the
    rendered user messages; model spans are what was sampled, ending in <|im_end|> or cut."""
    _, tokenizer, model = smollm2
    torch.manual_seed(0)
    engine = _engine(
        tokenizer, model, None, max_turns=3, max_tokens_per_turn=12, temperature=0.8
    )  # the template's own system prompt
    # seed 0 twice: the two copies share one read of their prompt (as a group's copies do)
    episodes = engine.run([StartState("starpo/FrozenLake-v0", s, (("is_slippery", False),)) for s in (0, 0, 1)])
    assert episodes[0].prompt_ids == episodes[1].prompt_ids
    # read: seed 0's prompt once but its last token (+ that token once per copy), seed 1's prompt, then
    # per later turn only the previous reply's last token and the env's tokens
    first = len(episodes[0].prompt_ids) - 1 + 2 + len(episodes[2].prompt_ids)
    later = sum(ep.env_mask.count(0) + ep.num_turns - 1 for ep in episodes)
    assert engine.backend.prefill_tokens == first + later
    for ep in episodes:
        assert ep.num_turns >= 2 and len(ep.completion_ids) == len(ep.env_mask) == len(ep.logprobs)
        assert_logprobs_match_a_forward_pass(model, ep, temperature=0.8, atol=2e-4)
        # env spans: an <|im_end|> closing a cut reply (if any), then exactly the rendered user message
        users = [m["content"] for m in ep.messages if m["role"] == "user"][1:]
        spans = [tokenizer.decode(ep.completion_ids[a:b]) for a, b in env_spans(ep)]
        assert len(spans) == len(users)
        for text, content in zip(spans, users):
            assert (
                text.removeprefix("<|im_end|>") == f"\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
            )


def test_real_model_replies_opened_by_the_prompt_are_exact_to_the_token(smollm2):
    """``reply_prefix: auto`` on the real template: every prompt ends with the template's assistant header and
    ``<answer>``; env spans decode to the rendered user message and the same opening; the sampled tokens after
    it keep their logprobs; the messages hold the opening and the reply."""
    _, tokenizer, model = smollm2
    torch.manual_seed(2)
    instruction = "Reply with only the name of the arm you pull, for example: <answer> {example_action} </answer>"
    engine = _engine(
        tokenizer,
        model,
        max_turns=2,
        max_tokens_per_turn=10,
        temperature=0.8,
        enable_think=False,
        reply_prefix="auto",
        format_instruction=instruction,
    )
    episodes = engine.run([StartState("starpo/Bandit-v0", s) for s in (0, 0, 1)])
    for ep in episodes:
        assert tokenizer.decode(ep.prompt_ids).endswith(
            "for example: <answer> Dragon </answer><|im_end|>\n<|im_start|>assistant\n<answer>"
        )
        assert_logprobs_match_a_forward_pass(model, ep, temperature=0.8, atol=2e-4)
        users = [m["content"] for m in ep.messages if m["role"] == "user"][1:]
        spans = [tokenizer.decode(ep.completion_ids[a:b]) for a, b in env_spans(ep)]
        assert len(spans) == len(users) == ep.num_turns - 1
        for text, content in zip(spans, users):
            expected = f"\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n<answer>"
            assert text.removeprefix("<|im_end|>") == expected
        replies = [m["content"] for m in ep.messages if m["role"] == "assistant"]
        assert replies and all(r.startswith("<answer>") for r in replies)


def test_real_model_truncation_keeps_masks_and_logprobs_exact(smollm2):
    _, tokenizer, model = smollm2
    torch.manual_seed(1)
    engine = _engine(tokenizer, model, max_turns=5, max_tokens_per_turn=10, max_episode_tokens=150)
    (ep,) = engine.run([StartState("starpo/Sokoban-v0", 3)])
    assert ep.truncated and ep.env_mask[-1] == 1 and len(ep.completion_ids) <= 150
    assert_logprobs_match_a_forward_pass(model, ep, atol=2e-4)


def test_one_lora_starpo_step_on_bandit_with_the_real_model(smollm2, tmp_path):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from starpo_trl import MultiTurnStarPOTrainer, StarPOConfig

    path, tokenizer, _ = smollm2
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # the model as any user loads it
    args = StarPOConfig(
        output_dir=str(tmp_path),
        env_id="starpo/Bandit-v0",
        num_start_states=2,
        num_generations=2,
        rollout_filter_ratio=1.0,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        max_steps=1,
        max_turns=1,
        max_tokens_per_turn=16,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        use_cpu=True,
    )
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = MultiTurnStarPOTrainer(model, args, processing_class=tokenizer, peft_config=lora)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    moved = [n for n, p in before.items() if not torch.equal(p, after[n])]
    assert moved and all("lora_" in n for n in moved)
    row = next(r for r in trainer.state.log_history if "env/Bandit-v0/success" in r)
    assert 0.0 <= row["env/Bandit-v0/format_error_rate"] <= 1.0 and row["completions/mean_length"] > 0


def test_warm_start_tokens_on_the_real_template_are_the_engine_tokens(smollm2):
    """SmolLM2's ChatML template has no {% generation %} markers (TRL's assistant-only SFT refuses it):
    the warm start's demonstrations are engine episodes, so their tokens are the engine's, with the
    replies (and <|im_end|>) masked in."""
    from conftest import ScriptedBackend

    from starpo_trl.warm_start import demonstrations

    _, tokenizer, model = smollm2
    cfg = RolloutConfig(max_turns=3)
    eos = eos_token_ids(tokenizer, model.generation_config.eos_token_id)
    (demo,) = demonstrations(tokenizer, eos, "starpo/FrozenLake-v0", {"is_slippery": False}, [5], 0.5, cfg, 1, 0)
    replies = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
    engine = RolloutEngine(tokenizer, ScriptedBackend(tokenizer, lambda call, i: replies[call], eos[0]), cfg, eos)
    ep = engine.run([StartState("starpo/FrozenLake-v0", 5, (("is_slippery", False),))])[0]
    assert engine.chat.turn_end_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert demo["input_ids"] == ep.prompt_ids + ep.completion_ids
    assert demo["assistant_masks"] == [0] * len(ep.prompt_ids) + ep.env_mask
    masked = [t for t, m in zip(demo["input_ids"], demo["assistant_masks"]) if m]
    assert tokenizer.decode(masked) == "".join(r + "<|im_end|>" for r in replies)


@pytest.mark.parametrize("space", [False, True])
def test_warm_start_space_before_answer_writes_the_arm_as_the_prompt_token(smollm2, space):
    """With ``space_before_answer`` the expert's answer is the very token the prompt names the arm with
    (SmolLM2: `` Crane``); without it the name is spelled from pieces (``Cr`` + ``ane``). Both parse to
    the arm."""
    from starpo_trl.rollout.prompting import parse_reply
    from starpo_trl.warm_start import demonstrations

    _, tokenizer, model = smollm2
    eos = eos_token_ids(tokenizer, model.generation_config.eos_token_id)
    cfg = RolloutConfig(max_turns=1, enable_think=False)
    kwargs = {"arm_names": [["Tiger", "Crane"]]}
    demos = demonstrations(tokenizer, eos, "starpo/Bandit-v0", kwargs, range(8), 1.0, cfg, space_before_answer=space)
    names = {tokenizer.convert_tokens_to_ids(tokenizer.tokenize(" " + n)[0]) for n in ("Tiger", "Crane")}
    assert all(len(tokenizer.tokenize(" " + n)) == 1 for n in ("Tiger", "Crane"))
    for demo in demos:
        (reply,) = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
        assert reply.startswith("<answer> ") == space
        assert parse_reply(reply, enable_think=False).actions[0] in ("Tiger", "Crane")
        prompt = [t for t, m in zip(demo["input_ids"], demo["assistant_masks"]) if not m]
        answer = [t for t, m in zip(demo["input_ids"], demo["assistant_masks"]) if m]
        assert names <= set(prompt)  # the prompt names both arms with these tokens
        assert len(names & set(answer)) == (1 if space else 0)
