"""Turn text and answer parsing: what the model reads each turn and how its reply becomes actions.

The format follows the paper's code: a system line; a first user message with the env's
instructions, the action budget and turn 1; then one user message per turn with the last turn's
reward and the new state. The model answers ``<think>...</think><answer>...</answer>`` (or only
``<answer>...</answer>`` with ``enable_think=False``); the answer is split on ``||`` into actions.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass, field

SYSTEM_PROMPT = "You are a helpful assistant."
ACTION_SEPARATOR = "||"
MAX_ANSWER_CHARS = 4096
_THINK_THEN_ANSWER = re.compile(r"</think>\s*<answer>")


def _find_think_answer(text: str) -> tuple[str, str] | None:
    """The first match of ``<think>(.*?)</think>\\s*<answer>(.*?)</answer>`` (DOTALL), in linear time.

    The one regex with two lazy groups is super-linear on degenerate replies (repeated tags); this
    finds the tags one after another and returns what that regex's first match would: the leftmost
    ``<think>``, the first ``</think>`` after it that is followed by whitespace and ``<answer>`` and
    has a ``</answer>`` after that, and the first such ``</answer>``.
    """
    start = text.find("<think>")
    if start < 0:
        return None
    # the first "</think> <answer>" after the <think> (linear: a literal, a whitespace run, a literal)
    joint = _THINK_THEN_ANSWER.search(text, start + len("<think>"))
    if joint is None:
        return None
    body = joint.end()
    end = text.find("</answer>", body)
    if end < 0:  # no later "</think> <answer>" can have a closing tag after it either
        return None
    return text[start + len("<think>") : joint.start()], text[body:end]


def _find_answer(text: str) -> str | None:
    """The first match of ``<answer>(.*?)</answer>`` (DOTALL), in linear time."""
    start = text.find("<answer>")
    if start < 0:
        return None
    end = text.find("</answer>", start + len("<answer>"))
    return None if end < 0 else text[start + len("<answer>") : end]


INSTRUCTION_FIELDS = ("example_action", "actions")  # what a custom format instruction may name in braces


class ActionNames(list):
    """The env's action names as an instruction field: ``{actions}`` lists them ("Up, Down, Left"),
    ``{actions[1]}`` names one."""

    def __format__(self, spec: str) -> str:
        return format(", ".join(self), spec)


def _template_fields(template: str) -> set[str]:
    """The base names of the fields a template names (``actions`` for ``{actions[1]}``)."""
    names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    return {re.split(r"[.\[]", name, maxsplit=1)[0] for name in names}


def names_fields(template: str | None) -> bool:
    """Whether a format instruction template names a field (``{example_action}``, ``{actions}``)."""
    return template is not None and bool(_template_fields(template))


def shuffled_actions(names, seed: int, copy: int) -> list[str]:
    """The action names in the order one episode's format line shows them (``shuffle_instruction_actions``): a
    permutation drawn from the episode's start seed and ``copy``, its place among the episodes of that start state
    in one rollout (so a group's episodes each draw their own), the same on every run and machine."""
    return random.Random(f"instruction-order/{seed}/{copy}").sample(list(names), len(names))


def format_instruction(enable_think: bool, template: str | None = None, env=None, order=None) -> str:
    """The line that ends every user message. ``template`` None: the paper's. Otherwise the template,
    with ``{example_action}`` replaced by the env's first action name and ``{actions}`` by its action
    names (``{actions[i]}``: the i-th; envs with named actions only). ``order``: the env's action names
    in the order to show them (``shuffled_actions``), the example being its first."""
    if template is None:
        if enable_think:
            return (
                "Always output: <think> [your thoughts] </think> <answer> [your answer] </answer> with no extra text."
            )
        return "Always output: <answer> [your answer] </answer> with no extra text."
    if not _template_fields(template):
        return template.format()
    env = env.unwrapped if hasattr(env, "unwrapped") else env
    names = getattr(env, "action_names", None)
    name = env.spec.id if getattr(env, "spec", None) is not None else type(env).__name__
    if not names:
        raise ValueError(
            f"format_instruction names {sorted(_template_fields(template))}, but {name} has no named actions: "
            "write the example into the instruction instead."
        )
    names = list(order) if order is not None else names
    try:
        return template.format(example_action=names[0], actions=ActionNames(names))
    except IndexError:
        raise ValueError(
            f"format_instruction {template!r} indexes past {name}'s {len(names)} actions ({', '.join(names)})."
        ) from None


def check_instruction_template(template: str | None) -> None:
    """Refuse a format instruction that names a field other than ``{example_action}`` and ``{actions}``
    (or breaks braces)."""
    if template is None:
        return
    try:
        names = _template_fields(template)
    except ValueError as err:
        raise ValueError(f"format_instruction {template!r} is not a valid template ({err}); write {{{{ for a brace.")
    unknown = names - set(INSTRUCTION_FIELDS)
    if unknown:
        raise ValueError(
            f"format_instruction may name only {{example_action}} (the env's first action) and {{actions}} (its "
            f"action names; {{actions[i]}}: the i-th), got {sorted(unknown)}; write {{{{ and }}}} for literal braces."
        )


def check_format_instruction(template: str | None, envs: list[tuple[str, dict]]) -> None:
    """``check_instruction_template``, then, when it names a field, that each ``(env_id, kwargs)`` env has
    named actions, enough for any ``{actions[i]}`` (run before any model loads)."""
    check_instruction_template(template)
    if not names_fields(template):
        return
    import gymnasium

    for env_id, kwargs in envs:
        env = gymnasium.make(env_id, **kwargs)
        try:
            format_instruction(False, template, env)  # raises, naming the env, without (enough) named actions
        finally:
            env.close()


def first_user_message(
    env,
    observation: str,
    max_actions_per_turn: int,
    max_turns: int,
    enable_think: bool,
    instruction: str | None = None,
    order=None,
) -> str:
    """Turn 1's message; ``instruction``: a custom format instruction template, ``order``: the order it shows
    the actions in (``format_instruction``)."""
    env = env.unwrapped if hasattr(env, "unwrapped") else env
    if env.action_names is not None and max_actions_per_turn == 1:
        budget = "You can make one action per turn."
    elif env.action_names is not None:
        budget = f"You can make up to {max_actions_per_turn} actions per turn, separated by {ACTION_SEPARATOR}."
    else:
        budget = "Give one answer."
    return f"{env.instructions}\n{budget} You have at most {max_turns} turns.\n" + turn_message(
        1, observation, None, None, enable_think, instruction, env, order
    )


def turn_message(
    turn: int,
    observation: str,
    actions_left: int | None,
    reward: float | None,
    enable_think: bool,
    instruction: str | None = None,
    env=None,
    order=None,
) -> str:
    parts = []
    if reward is not None:
        parts.append(f"Reward: {reward:g}")
    parts.append(f"Turn {turn}:\nState:\n{observation}")
    if actions_left is not None:
        parts.append(f"You have {actions_left} actions left.")
    parts.append(format_instruction(enable_think, instruction, env, order))
    return "\n".join(parts)


def resolve_reply_prefix(reply_prefix: str, enable_think: bool) -> str:
    """``auto``: ``<think>`` with thinking, else ``<answer>`` (the tags RAGEN opens every reply with);
    anything else as it is ("" : none)."""
    if reply_prefix == "auto":
        return "<think>" if enable_think else "<answer>"
    return reply_prefix


@dataclass
class ParsedReply:
    think: str | None
    answer: str | None
    actions: list[str] = field(default_factory=list)
    format_ok: bool = False


def parse_reply(
    text: str, enable_think: bool = True, split_actions: bool = True, max_actions: int | None = None
) -> ParsedReply:
    """Parse a model reply. Never raises: a reply without the format gives ``format_ok=False``.
    Linear in the reply's length, whatever the reply.

    ``split_actions=False`` keeps the whole answer as one action (free-text envs).
    ``max_actions`` caps the number of actions returned (the rest are ignored, not penalised).
    """
    if not isinstance(text, str):
        return ParsedReply(None, None)
    if enable_think:
        found = _find_think_answer(text)
        if found is None:
            return ParsedReply(None, None)
        think, answer = found[0].strip(), found[1].strip()
    else:
        found = _find_answer(text)
        if found is None:
            return ParsedReply(None, None)
        think, answer = None, found.strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return ParsedReply(think, answer or None)
    if split_actions:
        actions = [a.strip() for a in answer.split(ACTION_SEPARATOR) if a.strip()]
    else:
        actions = [answer]
    if max_actions is not None:
        actions = actions[:max_actions]
    return ParsedReply(think, answer, actions, format_ok=bool(actions))


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
# a reply's malformed tool calls each get an error message up to this many; the rest are counted in one more
MAX_TOOL_CALL_ERRORS = 8


@dataclass
class ToolCalls:
    calls: list[dict] = field(default_factory=list)  # {"name": str, "arguments": dict}, in order
    errors: list[str] = field(default_factory=list)  # one per malformed call, at most MAX_TOOL_CALL_ERRORS + 1


def parse_tool_calls(text: str) -> ToolCalls:
    """The ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks of a reply (the format of
    Qwen2.5 / Qwen3 / Hermes templates; ``arguments`` may also be a JSON string). A block that is not
    such a JSON object is an error (a format penalty), never a crash, whatever it holds (deep nesting,
    huge numbers). No block: a final answer. Only the reply's first ``16 * MAX_ANSWER_CHARS``
    characters are read; past ``MAX_TOOL_CALL_ERRORS`` errors one more message says how many were dropped."""
    import json

    if not isinstance(text, str):
        return ToolCalls(errors=["malformed tool call: the reply is not text"])
    text = text[: 16 * MAX_ANSWER_CHARS]
    out, errors = ToolCalls(), []
    for body in _TOOL_CALL.findall(text):
        try:
            call = json.loads(body.strip())
            arguments = call.get("arguments", {}) if isinstance(call, dict) else None
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
                raise ValueError('expected {"name": "<tool>", "arguments": {...}}')
            out.calls.append({"name": call["name"], "arguments": arguments})
        except ValueError as err:  # json.JSONDecodeError is a ValueError; so is an over-long integer
            errors.append(f"malformed tool call: {err}")
        except RecursionError:  # nesting deeper than the JSON decoder's recursion limit
            errors.append("malformed tool call: JSON nested too deeply")
    unclosed = text.count("<tool_call>") - len(out.calls) - len(errors)
    errors += ["malformed tool call: <tool_call> without its closing </tool_call>"] * max(0, unclosed)
    out.errors = errors[:MAX_TOOL_CALL_ERRORS]
    if len(errors) > MAX_TOOL_CALL_ERRORS:
        out.errors.append(f"{len(errors) - MAX_TOOL_CALL_ERRORS} more malformed tool calls in this reply (not listed)")
    return out
