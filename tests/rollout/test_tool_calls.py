"""A TRL environment class trained here: action_format="tool_call". The model's tool calls are run by
the env, their results appended as the template's tool messages (env tokens, mask 0), a reply without
a call ends the episode with get_reward(); malformed calls and unknown tools get the format penalty."""

import copy

import pytest
from conftest import ScriptedBackend
from helpers import make_args

from envs.trl_env import register_trl_environment
from starpo_trl import MultiTurnStarPOTrainer
from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.prompting import parse_tool_calls


class Counter:
    def reset(self, seed=None, **kwargs):
        self.count = 0
        return "Count to 3 with the increment tool, then say done."

    def increment(self, step: int = 1) -> str:
        """Add to the counter.

        Args:
            step: How much to add.

        Returns:
            The counter's new value.
        """
        if step > 5:
            raise ValueError("step too large")
        self.count += step
        return f"count={self.count}"

    def get_reward(self) -> float:
        return 1.0 if self.count == 3 else 0.0


def call(name="increment", **arguments):
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture
def tool_tokenizer(tiny_tokenizer):
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = copy.deepcopy(tiny_tokenizer)  # the fixture is shared: change a copy
    tok.chat_template = qwen2_5_chat_template
    return tok


def play(tok, replies, turns=4):
    env_id = register_trl_environment(Counter)
    backend = ScriptedBackend(tok, lambda c, i: replies[c], tok.convert_tokens_to_ids("<|im_end|>"))
    cfg = RolloutConfig(max_turns=turns, max_tokens_per_turn=160, action_format="tool_call")
    engine = RolloutEngine(tok, backend, cfg, [tok.convert_tokens_to_ids("<|im_end|>")])
    (ep,) = engine.run([StartState(env_id, 0)])
    return engine, ep


def test_parse_tool_calls():
    parsed = parse_tool_calls(call(step=2) + " and " + call("stop"))
    assert parsed.calls == [{"name": "increment", "arguments": {"step": 2}}, {"name": "stop", "arguments": {}}]
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>').calls[0][
        "arguments"
    ] == {"a": 1}
    assert parse_tool_calls("all done").calls == [] and parse_tool_calls("all done").errors == []
    cut = parse_tool_calls(call(step=1) + '<tool_call>\n{"name')  # a reply cut in its second call
    assert len(cut.calls) == 1 and len(cut.errors) == 1
    for bad in ("<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>', "<tool_call>{"):
        assert parse_tool_calls(bad).errors and not parse_tool_calls(bad).calls


def test_pathological_tool_calls_are_errors_not_crashes():
    """Deep nesting (past the JSON decoder's recursion limit) and an integer longer than Python converts
    are malformed calls, each one error message, never an exception (#45, item 1)."""
    nested = parse_tool_calls("<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>")
    assert nested.calls == [] and nested.errors == ["malformed tool call: JSON nested too deeply"]
    deep_arguments = parse_tool_calls(call(step=1)[:-14] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}}</tool_call>")
    assert deep_arguments.calls == [] and len(deep_arguments.errors) == 1
    huge = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}</tool_call>")
    assert huge.calls == [] and len(huge.errors) == 1 and "digits" in huge.errors[0]
    assert parse_tool_calls(None).errors and not parse_tool_calls(None).calls


def test_errors_per_reply_are_bounded_and_only_the_read_text_is_counted():
    """300 unclosed tags give MAX_TOOL_CALL_ERRORS messages and one that counts the rest; a reply past the
    read limit has its unclosed tags counted in the part read, not over the whole text (#45, item 7)."""
    from starpo_trl.rollout.prompting import MAX_ANSWER_CHARS, MAX_TOOL_CALL_ERRORS

    many = parse_tool_calls("<tool_call>x " * 300)
    assert len(many.errors) == MAX_TOOL_CALL_ERRORS + 1
    assert many.errors[-1] == f"{300 - MAX_TOOL_CALL_ERRORS} more malformed tool calls in this reply (not listed)"
    exactly = parse_tool_calls("<tool_call>x " * MAX_TOOL_CALL_ERRORS)
    assert len(exactly.errors) == MAX_TOOL_CALL_ERRORS and "more" not in exactly.errors[-1]
    one = call("f")
    long = parse_tool_calls(one * 100_000)
    read = 16 * MAX_ANSWER_CHARS
    assert len(long.calls) == read // len(one)
    assert long.errors == (
        ["malformed tool call: <tool_call> without its closing </tool_call>"] if read % len(one) else []
    )


def test_a_reply_of_300_unclosed_calls_makes_a_bounded_tool_message(tool_tokenizer):
    from starpo_trl.rollout.prompting import MAX_TOOL_CALL_ERRORS

    _, ep = play(tool_tokenizer, ["<tool_call>x" * 300, "done"])
    tools = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert len(tools) == MAX_TOOL_CALL_ERRORS + 1 and ep.num_format_errors == 1 and ep.turn_rewards[0] == -0.1


def test_tool_calls_run_and_the_episode_is_the_templates_conversation(tool_tokenizer):
    tok = tool_tokenizer
    engine, ep = play(tok, [call(step=1), call(step=1) + call(step=1), "done"])
    assert ep.success and ep.done and ep.turn_rewards == [0.0, 0.0, 1.0] and ep.num_actions == 4
    assert [m["role"] for m in ep.messages] == ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant"]
    assert [m["content"] for m in ep.messages if m["role"] == "tool"] == ["count=1", "count=2", "count=3"]
    # the tokens are the template's rendering of that conversation (tools listed), the replies verbatim
    schemas = engine.runner.make(ep.start.env_id, {}).unwrapped.tool_schemas
    render = tok.apply_chat_template(engine.chat.system + ep.messages, tools=schemas, tokenize=False)
    text = tok.decode(ep.prompt_ids + ep.completion_ids)
    assert render.startswith(text) and render[len(text) :] == "\n"
    env_text = tok.decode([t for t, m in zip(ep.completion_ids, ep.env_mask) if m == 0])
    assert "<tool_response>\ncount=2\n</tool_response>" in env_text and "increment" not in env_text


def test_malformed_calls_and_failing_tools_are_penalised_not_fatal(tool_tokenizer):
    _, ep = play(tool_tokenizer, ["<tool_call>{oops</tool_call>", call("jump"), call(step=9), "done"])
    assert ep.turn_rewards == [-0.1, -0.1, -0.1, 0.0] and ep.num_format_errors == 3 and not ep.success
    tools = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert "malformed tool call" in tools[0] and "Tool jump not found" in tools[1] and "step too large" in tools[2]


def test_training_on_a_trl_environment_class(tmp_path, tool_tokenizer, fresh_model):
    env_id = register_trl_environment(Counter)
    backend = ScriptedBackend(
        tool_tokenizer,
        # 1 then 2 (count 3: reward 1) for even episodes, 1 then 1 (count 2: reward 0) for odd ones
        lambda c, i: call(step=1) if c == 0 else call(step=2 - i % 2) if c == 1 else "done",
        tool_tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    fresh_model.generation_config.eos_token_id = tool_tokenizer.convert_tokens_to_ids("<|im_end|>")
    args = make_args(tmp_path, env_id=env_id, action_format="tool_call", max_turns=3, max_tokens_per_turn=160)
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tool_tokenizer, backend=backend)
    trainer.train()
    rows = [r for r in trainer.state.log_history if "env/Counter-v0/success" in r]
    assert rows and trainer.state.global_step == 2 and rows[0]["env/Counter-v0/success"] == 0.5
    with pytest.raises(ValueError, match="context_window='full'"):
        make_args(tmp_path, env_id=env_id, action_format="tool_call", context_window="single_turn")
    with pytest.raises(ValueError, match="action_format"):
        make_args(tmp_path, action_format="json")


def test_a_template_without_tool_calls_is_refused(tiny_tokenizer):
    with pytest.raises(ValueError, match="renders tool calls"):
        RolloutEngine(tiny_tokenizer, None, RolloutConfig(action_format="tool_call"), [tiny_tokenizer.eos_token_id])


def test_reward_functions_add_to_the_envs_reward(tmp_path, tool_tokenizer, fresh_model):
    env_id = register_trl_environment(Counter)
    end = tool_tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedBackend(tool_tokenizer, lambda c, i: call(step=3) if c == 0 else "done", end)
    fresh_model.generation_config.eos_token_id = end
    seen = []

    def brevity(prompts, completions, success, env_reward, **kwargs):
        seen.append((prompts, completions, success, env_reward))
        return [0.5 if c[-1]["content"] == "done" else None for c in completions]

    args = make_args(
        tmp_path, env_id=env_id, action_format="tool_call", max_turns=3, max_tokens_per_turn=160, max_steps=1
    )
    trainer = MultiTurnStarPOTrainer(
        fresh_model, args, processing_class=tool_tokenizer, backend=backend, reward_funcs=[brevity]
    )
    played = []
    play_ = trainer.play
    trainer.play = lambda starts, t: played.append(play_(starts, t)) or played[-1]
    trainer.train()
    prompts, completions, success, env_reward = seen[0]
    assert prompts[0] == [{"role": "user", "content": "Count to 3 with the increment tool, then say done."}]
    assert [m["role"] for m in completions[0]] == ["assistant", "tool", "assistant"] and all(success)
    assert env_reward == [1.0] * 16  # get_reward(): count reached 3
    assert all(ep.turn_rewards == [0.0, 1.5] for ep in played[0])  # 1.0 from the env + 0.5 from the function
    assert any("rewards/brevity/mean" in row for row in trainer.state.log_history)


@pytest.mark.parametrize("estimator", ["bilevel_gae"])
def test_a_trl_environment_class_with_the_critic(tmp_path, tool_tokenizer, fresh_model, estimator):
    """StarPO-S's filter and a critic with bi-level GAE apply to tool-call episodes as to any other."""
    env_id = register_trl_environment(Counter)
    end = tool_tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedBackend(
        tool_tokenizer, lambda c, i: call(step=1) if c == 0 else call(step=2 - i % 2) if c == 1 else "done", end
    )
    fresh_model.generation_config.eos_token_id = end
    args = make_args(
        tmp_path,
        env_id=env_id,
        action_format="tool_call",
        max_turns=3,
        max_tokens_per_turn=160,
        max_steps=1,
        advantage_estimator=estimator,
        use_turn_rewards=True,
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tool_tokenizer, backend=backend)
    start = [p.clone() for p in trainer.critic.trainable_parameters()]
    trainer.train()
    assert any((a != b).any() for a, b in zip(start, trainer.critic.trainable_parameters()))  # the critic learned
    logged = {k for row in trainer.state.log_history for k in row}
    assert {"critic/value_loss", "advantages/std", "rollout/kept_fraction"} <= logged


@pytest.mark.trains
def test_a_nan_or_raising_reward_function_in_training(tmp_path, tool_tokenizer, fresh_model):
    """A NaN from a reward function is a counted env error, its mean over the numbers (not None); a raising one
    stops train() naming it, unless reward_func_errors='mark' (#45, item 5)."""
    import math

    env_id = register_trl_environment(Counter)
    end = tool_tokenizer.convert_tokens_to_ids("<|im_end|>")
    fresh_model.generation_config.eos_token_id = end

    def half_nan(completions, seed, **kwargs):
        return [math.nan if i % 2 else 0.5 for i in range(len(seed))]

    def broken(**kwargs):
        raise KeyError("score")

    def trainer_with(funcs, **kw):
        backend = ScriptedBackend(tool_tokenizer, lambda c, i: call(step=3) if c == 0 else "done", end)
        args = make_args(
            tmp_path, env_id=env_id, action_format="tool_call", max_turns=3, max_tokens_per_turn=160, max_steps=1, **kw
        )
        return MultiTurnStarPOTrainer(
            fresh_model, args, processing_class=tool_tokenizer, backend=backend, reward_funcs=funcs
        )

    trainer = trainer_with([half_nan])
    trainer.train()
    (row,) = [r for r in trainer.state.log_history if "rewards/half_nan/mean" in r]
    assert row["rewards/half_nan/mean"] == 0.5 and row["env/errors"] == 8.0
    with pytest.raises(ValueError, match="reward function 'broken' failed on 16 episodes: KeyError"):
        trainer_with([broken]).train()
    marked = trainer_with([broken], reward_func_errors="mark")
    marked.train()  # every episode an env error: the step trains on nothing, training goes on
    assert [r["env/errors"] for r in marked.state.log_history if "env/errors" in r] == [16.0]
    with pytest.raises(ValueError, match="reward_func_errors must be one of"):
        make_args(tmp_path, reward_func_errors="ignore")
