"""Warm start: supervised fine-tuning on a noisy expert's episodes, in the RL phase's own format.

Each demonstration is a whole episode as chat messages: the same system line, first user message
and per-turn user messages the episode engine renders, with expert replies
``<think>The best action is X.</think><answer>X || Y</answer>``. TRL's ``SFTTrainer`` trains on
the assistant replies only (``assistant_only_loss``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from datasets import Dataset

from envs.base import noisy_expert_action
from starpo_trl.prompting import ACTION_SEPARATOR, SYSTEM_PROMPT, first_user_message, turn_message
from starpo_trl.rollout import RolloutConfig


def expert_reply(actions: list[str], enable_think: bool) -> str:
    answer = f" {ACTION_SEPARATOR} ".join(actions)
    if not enable_think:
        return f"<answer>{answer}</answer>"
    return f"<think>The best action is {actions[0]}.</think><answer>{answer}</answer>"


def demonstration(env_id: str, env_kwargs: dict, seed: int, noise: float, cfg: RolloutConfig, actions_per_turn: int, rng: np.random.Generator, system_prompt: str | None = SYSTEM_PROMPT) -> dict:
    """One noisy-expert episode as ``{"messages": [...], "reward": float, "success": bool}``."""
    env = gym.make(env_id, **env_kwargs)
    obs, _ = env.reset(seed=seed)
    named = env.unwrapped.action_names is not None
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": first_user_message(env, obs, cfg.max_actions_per_turn, cfg.max_turns, cfg.enable_think)})
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
        messages.append({"role": "user", "content": turn_message(turn + 1, obs, left if named else None, reward, cfg.enable_think)})
    env.close()
    return {"messages": messages, "reward": total, "success": success}


def demonstrations(env_id: str, env_kwargs: dict, seeds, noise: float, cfg: RolloutConfig, actions_per_turn: int = 1, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    rows = [demonstration(env_id, env_kwargs, s, noise, cfg, actions_per_turn, rng) for s in seeds]
    return Dataset.from_list(rows)


def warm_start(model, tokenizer, dataset: Dataset, output_dir: str, epochs: float = 2.0, learning_rate: float = 1e-3, batch_size: int = 16, seed: int = 0, **sft_kwargs):
    """SFT ``model`` on ``dataset`` (from `demonstrations`) with TRL's SFTTrainer; returns the model."""
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=output_dir,
        num_train_epochs=epochs,
        learning_rate=learning_rate,
        per_device_train_batch_size=batch_size,
        assistant_only_loss=True,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        seed=seed,
        bf16=False if not _has_bf16() else None,
        **sft_kwargs,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset.select_columns(["messages"]), processing_class=tokenizer)
    trainer.train()
    return trainer.model


def _has_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
