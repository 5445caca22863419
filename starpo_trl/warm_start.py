"""Warm start: supervised fine-tuning on a noisy expert's episodes, in the RL phase's own format.

The demonstrations are played by the episode engine itself, with ``ExpertBackend`` in place of a
model: each turn it writes the (noisy) expert's reply ``<think>The best action is X.</think>
<answer>X || Y</answer>`` for the episode's current env state, and the engine renders the turns,
steps the envs and builds the tokens exactly as in RL. TRL's ``SFTTrainer`` then trains on the
reply tokens only (an ``assistant_masks`` column, from the engine's mask). This needs no
``{% generation %}`` markers in the chat template, so it works with any template the engine
accepts (SmolLM2's ChatML included).
"""

from __future__ import annotations

import copy
import dataclasses
import os

import numpy as np
from datasets import Dataset

from envs.base import noisy_expert_action
from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.env_runner import LocalEnv
from starpo_trl.rollout.prompting import ACTION_SEPARATOR, SYSTEM_PROMPT


def expert_reply(
    actions: list[str], enable_think: bool, space_before_answer: bool = False, thought: str | None = None
) -> str:
    """The expert's reply. ``space_before_answer`` writes ``<answer> X</answer>``: with a BPE tokenizer
    a word after a space is usually the one token the prompt shows it as, where ``<answer>X`` may have to
    spell it in pieces. The parser strips the space either way.
    ``thought``: what the expert read off the state (``TextEnv.expert_thought``), put before the action
    in the think."""
    answer = f" {ACTION_SEPARATOR} ".join(actions)
    if space_before_answer:
        answer = " " + answer
    if not enable_think:
        return f"<answer>{answer}</answer>"
    think = f"The best action is {actions[0]}."
    if thought:
        think = f"{thought} {think}"
    return f"<think>{think}</think><answer>{answer}</answer>"


def gym_env(env):
    """The Gymnasium env behind the engine's handle (the runner is inline for demonstrations)."""
    return env.env if isinstance(env, LocalEnv) else env


def expert_thought(env) -> str:
    """``TextEnv.expert_thought`` of ``env`` (a Gymnasium text env or the engine's handle on one); an env
    without one is an error that names the setting to change."""
    inner = gym_env(env).unwrapped
    describe = getattr(inner, "expert_thought", None)
    thought = describe() if describe is not None else None
    if thought is None:
        name = type(inner).__name__
        raise ValueError(
            f"{name} has no expert_thought(): warm_start_think='state' needs an env that describes its state "
            "(FrozenLake, Sokoban); use warm_start_think='action'."
        )
    return thought


def check_expert_thought(env_id: str, env_kwargs: dict, seed: int = 0) -> None:
    """Raise (as ``expert_thought``) unless ``env_id`` describes its start state: before any model loads."""
    env = LocalEnv(env_id, env_kwargs)
    try:
        env.reset(seed)
        expert_thought(env)
    finally:
        env.env.close()


class ExpertBackend:
    """A generation backend that answers as the noisy expert (``envs.base.noisy_expert_action``).

    For each episode it plans up to ``actions_per_turn`` actions (within the turn's and the
    episode's budgets) on a copy of the env, so the real env is stepped only by the engine, and
    returns the reply's tokens with the end-of-turn token (logprobs 0). ``describe_state``: the think
    also says what the expert reads off the state (``TextEnv.expert_thought``)."""

    needs_envs = True

    def __init__(
        self,
        tokenizer,
        turn_end_id: int,
        noise: float,
        actions_per_turn: int,
        cfg: RolloutConfig,
        rng: np.random.Generator,
        space_before_answer: bool = False,
        describe_state: bool = False,
    ):
        self.tokenizer, self.turn_end_id, self.noise = tokenizer, turn_end_id, noise
        self.actions_per_turn, self.cfg, self.rng = actions_per_turn, cfg, rng
        self.space_before_answer, self.describe_state = space_before_answer, describe_state

    def _actions(self, env, actions_left: int) -> list[str]:
        env = gym_env(env)
        named = env.unwrapped.action_names is not None
        n = min(self.actions_per_turn if named else 1, self.cfg.max_actions_per_turn, actions_left)
        plan = copy.deepcopy(env) if n > 1 else env  # later actions are chosen from the state the first ones lead to
        actions = []
        for k in range(n):
            actions.append(noisy_expert_action(plan, self.noise, self.rng))
            if k < n - 1:
                _, _, terminated, truncated, _ = plan.step(actions[-1])
                if terminated or truncated:
                    break
        return actions

    def generate(self, sequences, max_new_tokens, temperature, turns=None):
        out = []
        prefix = self.cfg.prefix_text()  # the prompt already holds it: each demonstration goes on from there
        for env, actions_left in turns:
            thought = expert_thought(env) if self.describe_state else None  # the state before this turn's actions
            text = expert_reply(
                self._actions(env, actions_left), self.cfg.enable_think, self.space_before_answer, thought
            )
            if not text.startswith(prefix):
                raise ValueError(f"reply_prefix {prefix!r} does not open the expert's reply {text!r}")
            text = text[len(prefix) :]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.turn_end_id]
            out.append((ids, [0.0] * len(ids)))
        return out


def demonstrations(
    tokenizer,
    eos_token_ids: list[int],
    env_id: str,
    env_kwargs: dict,
    seeds,
    noise: float,
    cfg: RolloutConfig,
    actions_per_turn: int = 1,
    seed: int = 0,
    system_prompt: str | None = SYSTEM_PROMPT,
    space_before_answer: bool = False,
    describe_state: bool = False,
) -> Dataset:
    """Noisy-expert episodes from ``seeds``, played by the engine: one row each with ``messages``,
    ``reward``, ``success``, and the tokens ``input_ids`` / ``assistant_masks`` (1 on the expert's
    reply tokens and their end-of-turn token) that the warm start trains on. ``space_before_answer``:
    see `expert_reply`; ``describe_state``: see `ExpertBackend`."""
    cfg = dataclasses.replace(cfg, env_runner="inline", env_step_timeout=None)  # the expert plans on the env objects
    engine = RolloutEngine(tokenizer, None, cfg, eos_token_ids, system_prompt)
    backend = ExpertBackend(
        tokenizer,
        engine.chat.turn_end_id,
        noise,
        actions_per_turn,
        cfg,
        np.random.default_rng(seed),
        space_before_answer,
        describe_state,
    )
    kwargs = tuple(sorted(env_kwargs.items()))
    try:
        episodes = engine.run([StartState(env_id, int(s), kwargs) for s in seeds], backend=backend)
    finally:
        engine.close()
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return Dataset.from_list(
        [
            {
                "messages": system + ep.messages,
                "reward": ep.reward,
                "success": ep.success,
                "input_ids": ep.prompt_ids + ep.completion_ids,
                "assistant_masks": [0] * len(ep.prompt_ids) + ep.env_mask,
            }
            for ep in episodes
        ]
    )


def warm_start(
    model,
    tokenizer,
    dataset: Dataset,
    output_dir: str,
    epochs: float = 2.0,
    learning_rate: float = 1e-3,
    batch_size: int = 16,
    seed: int = 0,
    **sft_kwargs,
):
    """SFT ``model`` on ``dataset`` (from `demonstrations`: its ``input_ids`` and ``assistant_masks``)
    with TRL's SFTTrainer; returns the model."""
    from trl import SFTConfig, SFTTrainer

    tokens = dataset.select_columns(["input_ids", "assistant_masks"])
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


def warm_start_from_config(model, tokenizer, run_args, args, output_dir: str | None = None):
    """The warm start a run's settings ask for (``RunArguments.warm_start_*``, the env and episode
    settings of the ``StarPOConfig``), on the training seeds; SFT output under ``output_dir``
    (default ``args.output_dir/warm_start``). Returns the model."""
    from datasets import concatenate_datasets

    from starpo_trl.config import rollout_config
    from starpo_trl.env_configs import split_groups
    from starpo_trl.models import eos_token_ids

    # several training envs (env_configs): the demonstrations are split between them as the start states are
    envs = args.train_envs()
    shares = split_groups(envs, args.num_start_states)
    counts = [run_args.warm_start_episodes * n // sum(shares) for n in shares]
    counts[0] += run_args.warm_start_episodes - sum(counts)
    eos = eos_token_ids(tokenizer, model.generation_config.eos_token_id)
    demos = concatenate_datasets(
        [
            demonstrations(
                tokenizer,
                eos,
                env.env_id,
                env.env_kwargs,
                range(args.train_seed_offset, args.train_seed_offset + count),
                run_args.warm_start_noise,
                rollout_config(args),
                run_args.warm_start_actions_per_turn,
                seed=args.seed + i,
                space_before_answer=run_args.warm_start_space_before_answer,
                describe_state=run_args.warm_start_think == "state",
            )
            for i, (env, count) in enumerate(zip(envs, counts))
            if count
        ]
    )
    return warm_start(
        model,
        tokenizer,
        demos,
        output_dir or os.path.join(args.output_dir, "warm_start"),
        epochs=run_args.warm_start_epochs,
        learning_rate=run_args.warm_start_learning_rate,
        batch_size=run_args.warm_start_batch_size,
        seed=args.seed,
        use_cpu=args.use_cpu,  # the same devices as RL: a different choice here would reset the process layout
        # the run's memory trade: recomputing activations costs a forward pass per step, worth it only where
        # memory is short (TRL's configs turn it on by default); the weights come out the same either way
        gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
    )
