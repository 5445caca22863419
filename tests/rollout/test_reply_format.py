"""``reply_prefix`` (the prompt opens every reply, as RAGEN forces ``<answer>`` / ``<think>``),
``format_instruction`` (the format line of every user message) and ``stop_strings`` (a reply ends after
its first stop string): tokens checked to the token."""

import gymnasium as gym
import pytest
import torch
from conftest import assert_logprobs_match_a_forward_pass, env_spans

from starpo_trl.monitoring.mutual_info import reasoning_span
from starpo_trl.rollout import HFBackend, RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.engine import stop_index
from starpo_trl.rollout.prompting import (
    check_instruction_template,
    first_user_message,
    format_instruction,
    resolve_reply_prefix,
    shuffled_actions,
)

LAKE = StartState("starpo/FrozenLake-v0", 0, (("is_slippery", False),))  # Up three times does not end it


def engine(tokenizer, backend, **cfg):
    return RolloutEngine(tokenizer, backend, RolloutConfig(**cfg), [tokenizer.eos_token_id])


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_auto_prefix_is_the_opening_tag_of_the_format():
    assert resolve_reply_prefix("auto", enable_think=True) == "<think>"
    assert resolve_reply_prefix("auto", enable_think=False) == "<answer>"
    assert resolve_reply_prefix("", enable_think=True) == ""
    assert resolve_reply_prefix("<answer> ", enable_think=True) == "<answer> "


def test_the_first_message_states_the_action_budget_of_a_turn():
    """One action a turn is said as such (no separator to join several); more are said with the separator."""
    env = gym.make("starpo/FrozenLake-v0").unwrapped
    obs, _ = env.reset(seed=0)
    one = first_user_message(env, obs, 1, 6, enable_think=False)
    assert "\nYou can make one action per turn. You have at most 6 turns.\nTurn 1:" in one and "||" not in one
    two = first_user_message(env, obs, 2, 6, enable_think=False)
    assert "\nYou can make up to 2 actions per turn, separated by ||. You have at most 6 turns.\nTurn 1:" in two


def test_the_prompt_opens_each_reply_and_the_parser_reads_prefix_and_reply(tiny_tokenizer, scripted):
    """The prefix's tokens end the first prompt and every env span (mask 0: not trained); the model's tokens
    are its reply alone; the reply is parsed, and kept in the messages, with the prefix in front."""
    prefix = ids(tiny_tokenizer, "<answer>")
    (ep,) = engine(tiny_tokenizer, scripted("Up</answer>"), max_turns=3, enable_think=False, reply_prefix="auto").run(
        [LAKE]
    )
    assert ep.num_turns == 3 and ep.num_format_errors == 0 and ep.num_valid_actions == 3
    assert ep.prompt_ids[-len(prefix) :] == prefix
    assert tiny_tokenizer.decode(ep.prompt_ids).endswith("<|im_start|>assistant\n<answer>")
    users = [m["content"] for m in ep.messages if m["role"] == "user"][1:]
    for (a, b), content in zip(env_spans(ep), users, strict=True):
        text = tiny_tokenizer.decode(ep.completion_ids[a:b])
        assert text == f"\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n<answer>"
    model_ids = [t for t, m in zip(ep.completion_ids, ep.env_mask) if m == 1]
    assert model_ids == (ids(tiny_tokenizer, "Up</answer>") + [tiny_tokenizer.eos_token_id]) * 3
    assert [m["content"] for m in ep.messages if m["role"] == "assistant"] == ["<answer>Up</answer>"] * 3
    # the same reply without the prefix is a format error every turn
    (bare,) = engine(tiny_tokenizer, scripted("Up</answer>"), max_turns=3, enable_think=False).run([LAKE])
    assert bare.num_format_errors == 3 and bare.num_valid_actions == 0


def test_a_think_prefix_reads_the_reasoning_from_the_first_reply_token(tiny_tokenizer, scripted):
    (ep,) = engine(tiny_tokenizer, scripted("go up</think><answer>Up</answer>"), max_turns=1, reply_prefix="auto").run(
        [LAKE]
    )
    assert ep.num_format_errors == 0 and tiny_tokenizer.decode(ep.prompt_ids).endswith("assistant\n<think>")
    reply = ep.completion_ids[:-1]  # without the end-of-turn token
    start, end = reasoning_span(tiny_tokenizer, reply, prefix="<think>")
    assert start == 0 and tiny_tokenizer.decode(reply[start:end]) == "go up"
    assert reasoning_span(tiny_tokenizer, reply) is None  # no <think> in the reply's own tokens


def test_sampled_replies_after_a_prefix_keep_exact_logprobs_and_windows_keep_the_prefix(
    tiny_tokenizer, tiny_model, scripted
):
    torch.manual_seed(0)
    backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
    prefix = ids(tiny_tokenizer, "<think>")
    eps = engine(tiny_tokenizer, backend, max_turns=3, max_tokens_per_turn=10, reply_prefix="auto").run(
        [LAKE, LAKE, StartState("starpo/Sokoban-v0", 1)]
    )
    for ep in eps:
        assert_logprobs_match_a_forward_pass(tiny_model, ep, temperature=1.0)
        for a, b in env_spans(ep):
            assert ep.completion_ids[b - len(prefix) : b] == prefix
    backend = scripted("x</think><answer>Up</answer>")
    eps = engine(tiny_tokenizer, backend, max_turns=3, context_window="window:1", reply_prefix="auto").run(
        [StartState("starpo/Sokoban-v0", 1)]
    )
    assert len(eps[0].turn_prompts) == eps[0].num_turns == 3
    assert all(p[-len(prefix) :] == prefix for p in eps[0].turn_prompts)


def test_format_instruction_replaces_the_format_line_and_names_the_first_action(tiny_tokenizer, scripted):
    template = "Reply with one name, for example: <answer> {example_action} </answer> {{literal}}"
    env = gym.make("starpo/Bandit-v0").unwrapped
    assert format_instruction(False, template, env) == (
        f"Reply with one name, for example: <answer> {env.action_names[0]} </answer> {{literal}}"
    )
    assert format_instruction(False, "No fields {{here}}") == "No fields {here}"
    (ep,) = engine(
        tiny_tokenizer, scripted("<answer>Up</answer>"), max_turns=2, enable_think=False, format_instruction=template
    ).run([StartState("starpo/Sokoban-v0", 1)])
    users = [m["content"] for m in ep.messages if m["role"] == "user"]
    assert len(users) == 2 and all(u.endswith("for example: <answer> Up </answer> {literal}") for u in users)
    assert "Always output" not in "".join(users)
    with pytest.raises(ValueError, match="no named actions"):
        format_instruction(False, template, gym.make("starpo/Countdown-v0").unwrapped)


def test_actions_field_lists_and_indexes_the_names_of_each_episodes_env(tiny_tokenizer, scripted):
    """``{actions}`` and ``{actions[i]}`` follow the pair each episode draws (the user message is rendered
    after reset), so mirrored seeds show the same line; an index past the env's actions is refused."""
    pairs = (("Dragon", "Phoenix"), ("Lion", "Eagle"), ("Ruby", "Pearl"))
    kwargs = (("arm_names", pairs), ("expected_reward", True), ("mirror_seeds", True))
    template = "Pull one of {actions}: <answer>{actions[0]}</answer> or <answer>{actions[1]}</answer>"
    eps = engine(
        tiny_tokenizer, scripted("<answer>Up</answer>"), max_turns=1, enable_think=False, format_instruction=template
    ).run([StartState("starpo/Bandit-v0", seed, kwargs) for seed in range(6)])
    env = gym.make("starpo/Bandit-v0", **dict(kwargs)).unwrapped
    lines = []
    for seed, ep in enumerate(eps):
        env.reset(seed=seed)
        a, b = env.action_names
        user = next(m["content"] for m in ep.messages if m["role"] == "user")
        assert user.endswith(f"Pull one of {a}, {b}: <answer>{a}</answer> or <answer>{b}</answer>")
        lines.append(user.splitlines()[-1])
    assert len(set(lines)) > 1 and all(lines[k] == lines[k + 1] for k in (0, 2, 4))  # pairs vary; mirrors agree
    with pytest.raises(ValueError, match="indexes past starpo/Bandit-v0's 2 actions"):
        format_instruction(False, "<answer>{actions[2]}</answer>", env)
    with pytest.raises(ValueError, match="no named actions"):
        format_instruction(False, "One of {actions}", gym.make("starpo/Countdown-v0").unwrapped)


def test_shuffled_actions_are_a_seeded_permutation_spread_over_every_first_action():
    names = ["Left", "Down", "Right", "Up"]
    orders = [shuffled_actions(names, seed, copy) for seed in range(100) for copy in range(4)]
    assert all(sorted(o) == sorted(names) for o in orders)
    assert orders == [shuffled_actions(names, seed, copy) for seed in range(100) for copy in range(4)]  # reproducible
    assert names == ["Left", "Down", "Right", "Up"]  # the env's list is not shuffled in place
    firsts = [o[0] for o in orders]
    assert all(70 <= firsts.count(name) <= 130 for name in names)  # 100 each expected of 400
    assert len({tuple(o) for o in orders[:4]}) > 1  # the copies of one start state differ


def test_each_episode_shows_its_own_action_order_on_every_turn_and_window(tiny_tokenizer, scripted):
    """With ``shuffle_instruction_actions`` every user message of an episode (and a window's fresh first message)
    ends with the same line: the env's actions in an order of the episode's own, the example its first; a group's
    episodes draw different orders, and the same run gives the same lines."""
    template = "One of {actions}: <answer>{example_action}</answer>"
    names = gym.make("starpo/FrozenLake-v0").unwrapped.action_names
    starts = [LAKE] * 8 + [StartState("starpo/FrozenLake-v0", seed, LAKE.env_kwargs) for seed in range(1, 9)]

    def lines():
        eps = engine(
            tiny_tokenizer, scripted("<answer>Up</answer>"), max_turns=3, enable_think=False,
            format_instruction=template, shuffle_instruction_actions=True, context_window="window:1",
        ).run(starts)  # fmt: skip
        out = []
        for ep in eps:
            users = [m["content"].splitlines()[-1] for m in ep.messages if m["role"] == "user"]
            assert len(users) == 3 and len(set(users)) == 1  # one order for the whole episode
            window = tiny_tokenizer.decode(ep.turn_prompts[2])
            assert window.count(users[0]) == 2  # the window's fresh first message too
            out.append(users[0])
        return out

    shown = lines()
    for line in shown:
        listed = line.removeprefix("One of ").split(":")[0].split(", ")
        assert sorted(listed) == sorted(names) and line.endswith(f"<answer>{listed[0]}</answer>")
    assert len(set(shown[:8])) > 1  # one start state, eight episodes: not one order for the group
    assert len({line.split(", ")[0] for line in shown}) > 1  # first actions spread
    assert shown == lines()
    pairs = StartState("starpo/Bandit-v0", 3, (("arm_names", [["Tiger", "Crane"]]),))  # kwargs holding lists
    tigers = engine(
        tiny_tokenizer, scripted("<answer>Up</answer>"), max_turns=1, enable_think=False,
        format_instruction=template, shuffle_instruction_actions=True,
    ).run([pairs] * 8)  # fmt: skip
    shown_pairs = {ep.messages[0]["content"].splitlines()[-1] for ep in tigers}
    assert shown_pairs == {
        "One of Tiger, Crane: <answer>Tiger</answer>",
        "One of Crane, Tiger: <answer>Crane</answer>",
    }
    plain = engine(
        tiny_tokenizer, scripted("<answer>Up</answer>"), max_turns=1, enable_think=False, format_instruction=template
    ).run([LAKE])[0]
    assert plain.messages[0]["content"].endswith(f"One of {', '.join(names)}: <answer>{names[0]}</answer>")  # off


@pytest.mark.parametrize(
    "template, message",
    [("Answer {answer}", "may name only {example_action}"), ("Broken {", "not a valid template"), ("{0}", "only")],
)
def test_a_bad_instruction_template_is_refused(template, message):
    with pytest.raises(ValueError, match=message):
        check_instruction_template(template)
    check_instruction_template("Use <answer> {example_action} </answer>, {{braces}} kept")
    check_instruction_template("One of {actions}: <answer>{actions[0]}</answer>")


def test_bad_prefix_and_instruction_settings_fail_before_any_model_loads(tmp_path):
    from helpers import make_args

    with pytest.raises(ValueError, match="no named actions"):
        make_args(
            tmp_path, env_id="starpo/Countdown-v0", format_instruction="e.g. <answer> {example_action} </answer>"
        )
    with pytest.raises(ValueError, match="may name only"):
        make_args(tmp_path, format_instruction="<answer> {action} </answer>")
    with pytest.raises(ValueError, match="indexes past starpo/Bandit-v0's 2 actions"):
        make_args(tmp_path, env_id="starpo/Bandit-v0", format_instruction="<answer>{actions[2]}</answer>")
    with pytest.raises(ValueError, match="reply_prefix"):
        make_args(tmp_path, action_format="tool_call", reply_prefix="auto")
    with pytest.raises(
        ValueError, match="shuffle_instruction_actions shuffles the actions a format_instruction names"
    ):
        make_args(tmp_path, shuffle_instruction_actions=True, format_instruction="Answer <answer>Up</answer>")
    args = make_args(tmp_path, reply_prefix="auto", format_instruction="e.g. <answer> {example_action} </answer>")
    from starpo_trl.config import ROLLOUT_SETTINGS, rollout_config

    saved = {"reply_prefix", "format_instruction", "shuffle_instruction_actions"}
    assert saved <= set(ROLLOUT_SETTINGS)  # saved with the model for evaluate.py
    assert rollout_config(args).prefix_text() == "<think>"


def test_warm_start_demonstrations_go_on_from_the_prefix(tiny_tokenizer):
    """The prompt already holds the prefix: the expert's masked tokens are the rest of its reply, and the
    whole row reads as the reply written out once."""
    from starpo_trl.warm_start import demonstrations

    eos = [tiny_tokenizer.eos_token_id]
    cfg = RolloutConfig(max_turns=2, enable_think=False, reply_prefix="auto")
    (demo,) = demonstrations(tiny_tokenizer, eos, "starpo/FrozenLake-v0", {"is_slippery": False}, [0], 0.0, cfg)
    replies = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
    assert len(replies) == 2 and all(r.startswith("<answer>") and r.count("<answer>") == 1 for r in replies)
    masked = [t for t, m in zip(demo["input_ids"], demo["assistant_masks"]) if m]
    assert tiny_tokenizer.decode(masked) == "".join(r[len("<answer>") :] + "<|im_end|>" for r in replies)
    text = tiny_tokenizer.decode(demo["input_ids"])
    assert text.count("assistant\n<answer>") == 2 and "<answer><answer>" not in text


def test_stop_index_keeps_the_reply_up_to_the_token_that_completes_a_stop_string(tiny_tokenizer):
    reply = ids(tiny_tokenizer, "<answer>Up</answer> and then some more text")
    k = stop_index(tiny_tokenizer, reply, ["</answer>"])
    assert tiny_tokenizer.decode(reply[:k]).endswith("</answer>") and "</answer>" not in tiny_tokenizer.decode(
        reply[: k - 1]
    )
    assert k < len(reply)
    assert stop_index(tiny_tokenizer, reply, ["</think>"]) == len(reply)  # none occurs: all kept
    assert stop_index(tiny_tokenizer, reply, []) == stop_index(tiny_tokenizer, reply, None) == len(reply)
    assert stop_index(tiny_tokenizer, reply, ["</think>", "Up"]) < k  # the first of several


def test_a_reply_ends_at_its_stop_string_and_the_turn_closes_as_a_cut_reply(tiny_tokenizer, scripted):
    text = "<answer>Up</answer> and then some more text"
    cfg = dict(max_turns=2, enable_think=False, stop_strings=["</answer>"])
    (ep,) = engine(tiny_tokenizer, scripted(text), **cfg).run([LAKE])
    kept = ids(tiny_tokenizer, text)[: stop_index(tiny_tokenizer, ids(tiny_tokenizer, text), ["</answer>"])]
    assert ep.num_turns == 2 and ep.num_format_errors == 0
    (a, b) = env_spans(ep)[0]
    assert ep.completion_ids[:a] == kept and ep.logprobs[:a] == [-1.0] * len(kept)
    assert tiny_tokenizer.decode(ep.completion_ids[a:b]).startswith("<|im_end|>\n<|im_start|>user\n")
    assert ep.completion_ids[b:] == kept and len(ep.logprobs) == len(ep.completion_ids)
    assert [m["content"] for m in ep.messages if m["role"] == "assistant"] == ["<answer>Up</answer>"] * 2


def test_sampled_replies_cut_at_stop_strings_keep_exact_logprobs(tiny_tokenizer, tiny_model):
    torch.manual_seed(3)
    backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
    stops = ["e", "a"]  # frequent in the tiny model's text, so most replies are cut early
    eps = engine(tiny_tokenizer, backend, max_turns=3, max_tokens_per_turn=16, stop_strings=stops).run(
        [LAKE, LAKE, StartState("starpo/Sokoban-v0", 1)]
    )
    cut = 0
    for ep in eps:
        assert_logprobs_match_a_forward_pass(tiny_model, ep, temperature=1.0)
        starts = [*ep.reply_starts]
        ends = [p + 1 for p in ep.turn_end_positions]
        for a, b in zip(starts, ends, strict=True):
            reply = ep.completion_ids[a:b]
            before = tiny_tokenizer.decode(reply[:-1], skip_special_tokens=True)
            assert not any(s in before for s in stops)  # nothing was kept after a stop string
            cut += any(s in tiny_tokenizer.decode(reply, skip_special_tokens=True) for s in stops)
    assert cut >= 3


def test_hf_rows_stop_at_their_stop_string_and_the_next_turn_reuses_their_cache(tiny_tokenizer, tiny_model):
    """Each row stops sampling at its stop string (the call when all have), and its kept cache is the cut
    reply's, so every later turn feeds only the reply's last token and the env message: counted by hand."""
    torch.manual_seed(5)
    backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
    stops = ["e", "a"]
    eps = engine(tiny_tokenizer, backend, max_turns=3, max_tokens_per_turn=16, stop_strings=stops).run(
        [LAKE, LAKE, StartState("starpo/Sokoban-v0", 1)]
    )
    replies = [[ep.completion_ids[a : b + 1] for a, b in zip(ep.reply_starts, ep.turn_end_positions)] for ep in eps]
    calls = max(len(r) for r in replies)
    assert backend.decode_steps == sum(max(len(r[t]) for r in replies if len(r) > t) for t in range(calls))
    assert backend.decode_steps < 16 * calls  # no call was sampled on to the token limit
    # the two copies of LAKE's first prompt are read once but their last token, which each copy feeds
    first = len(eps[0].prompt_ids) - 1 + 2 + len(eps[2].prompt_ids)
    later = sum(1 + (a - b - 1) for ep in eps for a, b in zip(ep.reply_starts[1:], ep.turn_end_positions))
    assert backend.prefill_tokens == first + later
    assert sum(len(r) for r in replies) > len(eps) and later > 0  # some episodes went on after a cut reply
    for ep in eps:
        assert_logprobs_match_a_forward_pass(tiny_model, ep, temperature=1.0)
        for reply in (ep.completion_ids[a : b + 1] for a, b in zip(ep.reply_starts, ep.turn_end_positions)):
            assert not any(s in tiny_tokenizer.decode(reply[:-1], skip_special_tokens=True) for s in stops)


def test_stop_strings_are_checked_before_any_model_loads_and_saved_for_evaluate(tmp_path):
    from helpers import make_args

    from starpo_trl.config import ROLLOUT_SETTINGS, rollout_config

    for bad in ("</answer>", [""], [3]):
        with pytest.raises(ValueError, match="stop_strings must be a list of non-empty strings"):
            make_args(tmp_path, stop_strings=bad)
    assert rollout_config(make_args(tmp_path, stop_strings=["</answer>"])).stop_strings == ["</answer>"]
    assert "stop_strings" in ROLLOUT_SETTINGS
