"""Our envs in TRL's own multi-turn route: GRPOTrainer(environment_factory=trl_environment(...))."""

import copy

import gymnasium as gym
import pytest
import torch

import envs  # noqa: F401
from envs.trl_env import trl_environment


def test_the_environment_class_plays_the_env():
    FrozenLake = trl_environment("starpo/FrozenLake-v0", {"is_slippery": False})
    env, local = FrozenLake(), gym.make("starpo/FrozenLake-v0", is_slippery=False)
    text = env.reset(seed=3, prompt="ignored")
    observation, _ = local.reset(seed=3)
    assert (
        text.endswith(observation)
        and local.unwrapped.instructions in text
        and "Actions: Left, Down, Right, Up." in text
    )
    total = 0.0
    for _ in range(10):
        action = local.unwrapped.expert_action()
        out = env.act(action)
        observation, reward, terminated, truncated, info = local.step(action)
        total += reward
        assert out.startswith(observation) and env.get_reward() == total
        if terminated or truncated:
            break
    assert env.done and env.success and out.endswith("The episode is over: solved.")
    assert env.act("Up") == "The episode is over: no more actions."
    env.reset(seed=3)
    assert "'Jump' is not a valid action." in env.act("Jump") and not env.done
    # a reply of any length is quoted back cut to ECHO_CHARS (#45, item 7)
    echoed = env.act("x" * 1_000_000)
    assert len(echoed) < len(local.unwrapped.render_text()) + 200 and "(1000000 characters)" in echoed
    assert f"'{'x' * 80}'... (1000000 characters) is not a valid action." in echoed
    with pytest.raises(Exception, match="Nope"):
        trl_environment("starpo/Nope-v0")


def test_one_trl_grpo_step_with_tool_calls_into_frozenlake(tmp_path, tiny_tokenizer, fresh_model):
    """A stock TRL GRPOTrainer with our env as its environment_factory: the model (its generate scripted to
    call the tool, then to answer) calls act, TRL runs the tool, appends its result and trains a step."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = copy.deepcopy(tiny_tokenizer)  # the fixture is shared: change a copy
    tok.chat_template = qwen2_5_chat_template  # a template TRL knows how to parse tool calls from
    call = tok('<tool_call>\n{"name": "act", "arguments": {"action": "Down"}}\n</tool_call>', add_special_tokens=False)
    answer = tok("Done.", add_special_tokens=False)["input_ids"]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    script = {"calls": 0}

    def generate(input_ids, attention_mask=None, **kwargs):  # the model's turn: a tool call first, then an answer
        script["calls"] += 1
        reply = (call["input_ids"] if script["calls"] == 1 else answer) + [eos]
        return torch.cat([input_ids, torch.tensor([reply] * len(input_ids))], dim=1)

    fresh_model.generate = generate
    FrozenLake = trl_environment("starpo/FrozenLake-v0", {"is_slippery": False})
    made = []

    def factory():
        made.append(FrozenLake())
        return made[-1]

    dataset = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": "Cross the lake."}]] * 4, "seed": [0, 1, 2, 3]}
    )
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=256,
        max_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=fresh_model, args=args, train_dataset=dataset, processing_class=tok, environment_factory=factory
    )
    trainer.train()
    stepped = [e for e in made if e.steps]
    assert len(stepped) == 4 and all(e.steps == 1 for e in stepped)  # every rollout called act once
    logged = {k: v for row in trainer.state.log_history for k, v in row.items()}
    assert "rewards/FrozenLakeEnvironment/mean" in logged and trainer.state.global_step == 1
    assert logged["tools/call_frequency"] > 0 and logged["tools/failure_frequency"] == 0
