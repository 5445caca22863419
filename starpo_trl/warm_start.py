"""Warm start: supervised fine-tuning on a noisy expert's episodes, in the RL phase's own format.

Each demonstration is a whole episode as chat messages: the same system line, first user message
and per-turn user messages the episode engine renders, with expert replies
``<think>The best action is X.</think><answer>X || Y</answer>``. They are tokenized exactly as the
engine builds an episode (``ChatFormat``: prompt, reply tokens + end-of-turn token, the template's
tokens for each next user message), and TRL's ``SFTTrainer`` trains on the reply tokens only (an
``assistant_masks`` column). This needs no ``{% generation %}`` markers in the chat template, so it
works with any template the engine accepts (SmolLM2's ChatML included).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from datasets import Dataset

from envs.base import noisy_expert_action
from starpo_trl.models import eos_token_ids
from starpo_trl.rollout import ChatFormat, RolloutConfig
from starpo_trl.rollout.prompting import (
    ACTION_SEPARATOR,
    SYSTEM_PROMPT,
    first_user_message,
    turn_message,
)


def expert_reply(actions: list[str], enable_think: bool) -> str:
    answer = f" {ACTION_SEPARATOR} ".join(actions)
    if not enable_think:
        return f"<answer>{answer}</answer>"
    return f"<think>The best action is {actions[0]}.</think><answer>{answer}</answer>"


def demonstration(
    env_id: str,
    env_kwargs: dict,
    seed: int,
    noise: float,
    cfg: RolloutConfig,
    actions_per_turn: int,
    rng: np.random.Generator,
    system_prompt: str | None = SYSTEM_PROMPT,
) -> dict:
    """One noisy-expert episode as ``{"messages": [...], "reward": float, "success": bool}``."""
    env = gym.make(env_id, **env_kwargs)
    obs, _ = env.reset(seed=seed)
    named = env.unwrapped.action_names is not None
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append(
        {
            "role": "user",
            "content": first_user_message(env, obs, cfg.max_actions_per_turn, cfg.max_turns, cfg.enable_think),
        }
    )
    total, success, left = 0.0, False, cfg.max_actions_per_episode
    for turn in range(1, cfg.max_turns + 1):
        actions, reward, done = [], 0.0, False
        for _ in range(min(actions_per_turn if named else 1, cfg.max_actions_per_turn, left)):
            action = noisy_expert_action(env, noise, rng)
            actions.append(action)
            obs, r, terminated, truncated, info = env.step(action)
            reward += r
            left -= 1
            if terminated or truncated:
                success, done = bool(info["success"]), True
                break
        messages.append({"role": "assistant", "content": expert_reply(actions, cfg.enable_think)})
        total += reward
        if done or turn == cfg.max_turns or left <= 0:
            break
        messages.append(
            {"role": "user", "content": turn_message(turn + 1, obs, left if named else None, reward, cfg.enable_think)}
        )
    env.close()
    return {"messages": messages, "reward": total, "success": success}


def demonstrations(
    env_id: str, env_kwargs: dict, seeds, noise: float, cfg: RolloutConfig, actions_per_turn: int = 1, seed: int = 0
) -> Dataset:
    rng = np.random.default_rng(seed)
    rows = [demonstration(env_id, env_kwargs, s, noise, cfg, actions_per_turn, rng) for s in seeds]
    return Dataset.from_list(rows)


def tokenize_demonstration(messages: list[dict], chat: ChatFormat) -> dict:
    """``{"input_ids", "assistant_masks"}`` of one demonstration, token for token as the engine builds an episode.

    ``messages`` starts with the first user message (a leading system message must be the one
    ``chat`` was built with, and is dropped); the mask is 1 on every expert reply token and the
    end-of-turn token that closes it, 0 on the prompt and the env's messages.
    """
    if messages and messages[0]["role"] == "system":
        if chat.system != messages[:1]:
            raise ValueError("the demonstration's system message differs from the chat format's system prompt")
        messages = messages[1:]
    if not messages or messages[0]["role"] != "user":
        raise ValueError("a demonstration starts with a user message")
    ids = chat.prompt_ids(messages[0]["content"])
    mask = [0] * len(ids)
    for message in messages[1:]:
        if message["role"] == "assistant":
            reply = chat.tokenizer(message["content"], add_special_tokens=False)["input_ids"] + [chat.turn_end_id]
            ids, mask = ids + reply, mask + [1] * len(reply)
        else:
            env = chat.message_ids(message)
            ids, mask = ids + env, mask + [0] * len(env)
    return {"input_ids": ids, "assistant_masks": mask}


def warm_start(
    model,
    tokenizer,
    dataset: Dataset,
    output_dir: str,
    epochs: float = 2.0,
    learning_rate: float = 1e-3,
    batch_size: int = 16,
    seed: int = 0,
    system_prompt: str | None = SYSTEM_PROMPT,
    **sft_kwargs,
):
    """SFT ``model`` on ``dataset`` (from `demonstrations`) with TRL's SFTTrainer; returns the model."""
    from trl import SFTConfig, SFTTrainer

    chat = ChatFormat(tokenizer, eos_token_ids(tokenizer, model.generation_config.eos_token_id), system_prompt)
    tokens = Dataset.from_list([tokenize_demonstration(m, chat) for m in dataset["messages"]])
    args = SFTConfig(
        output_dir=output_dir,
        num_train_epochs=epochs,
        learning_rate=learning_rate,
        per_device_train_batch_size=batch_size,
        max_length=None,  # demonstrations are whole episodes: never cut
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        seed=seed,
        bf16=False if not _has_bf16() else None,
        **sft_kwargs,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=tokens, processing_class=tokenizer)
    trainer.train()
    return trainer.model


def _has_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
