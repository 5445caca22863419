"""An offline tiny model and tokenizer, so tests and the CPU demo need no network.

The tokenizer is a byte-level BPE (like Qwen's: any text round-trips) trained on the project's own
prompt text and env renders, with ChatML special tokens and chat template. The model is a small
Qwen2-architecture causal LM with random weights. Both are deterministic in their seed.

Real runs load a Hub model (``Qwen/Qwen2.5-0.5B-Instruct``...) instead; nothing in the library
depends on this module.
"""

from __future__ import annotations

import json
import os

import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

# ChatML, with `{% generation %}` markers around assistant replies so SFT can train on them alone.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Kept whole so the tiny model sees the answer format as single tokens (real tokenizers split them).
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>", "||"]


# the envs whose texts the tokenizer is trained on: fixed, so a new env (or one whose package is not
# installed) leaves the tiny tokenizer, and every tiny run and test, exactly as they were
CORPUS_ENV_IDS = (
    "starpo/Bandit-v0",
    "starpo/BanditTest-v0",
    "starpo/BanditSymbolic-v0",
    "starpo/BanditSymbolicTest-v0",
    "starpo/Sokoban-v0",
    "starpo/SokobanAlt-v0",
    "starpo/FrozenLake-v0",
    "starpo/Countdown-v0",
    "starpo/Arithmetic-v0",
    "starpo/Taxi-v0",
    "starpo/CliffWalking-v0",
)


def _corpus() -> list[str]:
    import gymnasium as gym

    import envs  # noqa: F401  (registers the envs)
    from starpo_trl.rollout.prompting import first_user_message, turn_message

    lines = []
    for env_id in CORPUS_ENV_IDS:
        env = gym.make(env_id).unwrapped
        for seed in range(30):
            obs, _ = env.reset(seed=seed)
            lines.append(first_user_message(env, obs, max_actions_per_turn=5, max_turns=5, enable_think=True))
            lines.append(turn_message(2, obs, actions_left=4, reward=-0.1, enable_think=True))
            answer = env.expert_action()
            lines.append(f"<think>I choose {answer}.</think><answer>{answer}</answer>")
    lines.append("You are a helpful assistant. " + " ".join(str(i) for i in range(200)))
    lines.extend(["system", "user", "assistant"] * 20)
    return lines


def build_tiny_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerBase:
    """A ``Qwen2Tokenizer`` (Qwen's byte-level BPE pre-tokenisation) with a small vocabulary trained here.

    Being a real ``Qwen2Tokenizer`` means a saved tiny checkpoint reloads through ``AutoTokenizer``
    with exactly the same tokenisation, as a Hub Qwen checkpoint would.
    """
    from transformers.models.qwen2.tokenization_qwen2 import (
        PRETOKENIZE_REGEX,
        Qwen2Tokenizer,
    )

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]],
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        extra_special_tokens=["<|im_start|>"],
    )
    tokenizer.add_tokens(TAG_TOKENS)
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, seed: int = 0, hidden_size: int = 64, num_layers: int = 2
) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def save_tiny(path: str, seed: int = 0, **model_kwargs) -> str:
    """Build the tiny tokenizer and model and save them as a local checkpoint directory."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **model_kwargs)
    os.makedirs(path, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path
