"""TRL's environment classes, both ways.

Out: any registered text env as a TRL environment, ``GRPOTrainer(environment_factory=trl_environment(...))``.
In: a TRL environment class (the one a TRL user already has) as a text env for ``MultiTurnStarPOTrainer``,
``register_trl_environment(MyEnv)``, played with ``action_format="tool_call"``.

TRL's multi-turn route (``environment_factory``) takes a class with ``reset(**row)`` (its text is
appended to the prompt), public methods that the model calls as tools, and optionally
``get_reward()``. ``trl_environment("starpo/Sokoban-v0")`` builds one for any text env here:

- ``reset(seed=..., **row)``: resets the env with the dataset row's ``seed`` (or a fresh draw) and
  returns its instructions, the named actions and the first observation;
- ``act(action)``: the one tool, one env step; returns the next observation (and says when the
  episode is over, or that the action was invalid);
- ``get_reward()``: the episode's total env reward so far; ``success`` says whether the task was solved.

::

    from trl import GRPOConfig, GRPOTrainer
    from envs.trl_env import trl_environment

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Solve the puzzle."}]] * 64, "seed": list(range(64))})
    trainer = GRPOTrainer(model="Qwen/Qwen3-0.6B", args=GRPOConfig(...), train_dataset=dataset,
                          environment_factory=trl_environment("starpo/Sokoban-v0"))
"""

from __future__ import annotations

import inspect
import json

import gymnasium as gym

import envs  # noqa: F401  (registers the envs)
from envs.base import TextEnv, step_info
from envs.contract import env_name

ECHO_CHARS = 80  # an invalid action is quoted back to the model up to this many characters


def _echo(action) -> str:
    """An action quoted back to the model, cut to ``ECHO_CHARS`` (a reply can be any length)."""
    text = str(action)
    return repr(text) if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]!r}... ({len(text)} characters)"


def trl_environment(env_id: str, env_kwargs: dict | None = None) -> type:
    """A TRL environment class (one instance per rollout) playing ``gymnasium.make(env_id, **env_kwargs)``."""
    kwargs = dict(env_kwargs or {})
    gym.make(env_id, **kwargs).close()  # a bad id or kwargs fail here, not inside a training step

    class TextEnvironment:
        def __init__(self):
            self.env = gym.make(env_id, **kwargs)
            self.reward, self.done, self.success, self.steps = 0.0, False, False, 0

        def reset(self, seed: int | None = None, **row) -> str:
            observation, _ = self.env.reset(seed=None if seed is None else int(seed))
            self.reward, self.done, self.success, self.steps = 0.0, False, False, 0
            inner = self.env.unwrapped
            names = getattr(inner, "action_names", None)
            actions = f"Actions: {', '.join(names)}." if names else "Actions: free text."
            return (
                f"\n\n{inner.instructions}\n{actions}\nCall the act tool with one action at a time.\n\n{observation}"
            )

        def act(self, action: str) -> str:
            """Take one action in the environment and see what happens.

            Args:
                action: The action to take, e.g. one of the actions the environment lists.

            Returns:
                What the environment shows after the action, and whether the episode is over.
            """
            if self.done:
                return "The episode is over: no more actions."
            observation, reward, terminated, truncated, info = self.env.step(str(action))
            self.steps += 1
            self.reward += float(reward)
            self.done = bool(terminated or truncated)
            self.success = bool(info.get("success", False))
            notes = [] if info.get("action_is_valid", True) else [f"{_echo(action)} is not a valid action."]
            if self.done:
                notes.append("The episode is over" + (": solved." if self.success else "."))
            return "\n".join([str(observation), *notes])

        def get_reward(self) -> float:
            """The episode's total env reward so far."""
            return self.reward

    base = "".join(c for c in env_name(env_id).split("-")[0] if c.isalnum()) or "Text"
    name = base[0].upper() + base[1:] + "Environment"  # starpo/FrozenLake-v0 -> FrozenLakeEnvironment
    TextEnvironment.__name__ = TextEnvironment.__qualname__ = name  # TRL logs the env's reward under this name
    return TextEnvironment


class TRLEnvAdapter(TextEnv):
    """A TRL environment class (``reset(**kwargs)`` returning its opening text or None; public methods
    as tools; optionally ``get_reward()``) as a text env whose actions are tool calls.

    ``step({"name": ..., "arguments": {...}})`` calls that tool; its return value (as text) is what
    the model reads next; an unknown tool or one that raises gives ``{"error": ...}`` and counts as an
    invalid action (the engine's format penalty). ``step(text)`` (a reply without a tool call) is the
    final answer: the episode ends with ``get_reward()`` as its reward (0 without it). ``success`` is
    the environment's own ``success`` attribute when it has one, else a positive reward.
    """

    def __init__(self, factory=None, render_mode: str | None = None):
        super().__init__(render_mode)
        from transformers.utils import get_json_schema

        if factory is None:
            raise ValueError("TRLEnvAdapter needs the environment class (or factory): register_trl_environment(MyEnv)")
        self.target = factory()
        if not callable(getattr(self.target, "reset", None)):
            raise ValueError(f"{type(self.target).__name__} has no reset(): a TRL environment needs one.")
        self.tools = {
            name: getattr(self.target, name)
            for name, _ in inspect.getmembers(type(self.target), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward")
        }
        self.tool_schemas = [get_json_schema(fn) for fn in self.tools.values()]
        self.text = ""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        try:
            opening = self.target.reset(seed=seed)
        except TypeError:  # a reset that takes no seed
            opening = self.target.reset()
        self.text = "" if opening is None else str(opening)
        return self.text, step_info(False, True, False)

    def step(self, action):
        if isinstance(action, dict):
            name, arguments = action.get("name"), action.get("arguments") or {}
            try:
                if name not in self.tools:
                    raise ValueError(f"Tool {name} not found; the tools are {sorted(self.tools)}")
                result, valid = self.tools[name](**arguments), True
            except Exception as err:  # the tool's failure is the model's to read, not a crash
                result, valid = {"error": str(err)}, False
            self.text = result if isinstance(result, str) else json.dumps(result, default=str)
            return self.text, 0.0, False, False, step_info(False, valid, valid)
        get_reward = getattr(self.target, "get_reward", None)
        reward = float(get_reward()) if callable(get_reward) else 0.0
        success = bool(getattr(self.target, "success", reward > 0))
        self.text = str(action)
        return self.text, reward, True, False, step_info(success, True, True)

    def render_text(self) -> str:
        return self.text


def register_trl_environment(factory, env_id: str | None = None) -> str:
    """Register a TRL environment class (or factory) as a text env; returns its id (default
    ``trl/<ClassName>-v0``) for ``StarPOConfig(env_id=..., action_format="tool_call")``. With
    ``env_runner="processes"`` the class must be importable from the worker (a module, not a notebook)."""
    name = env_id or f"trl/{getattr(factory, '__name__', 'Environment')}-v0"
    if name in gym.registry:
        del gym.registry[name]  # re-registering (a notebook cell run twice) replaces it
    gym.register(
        name, entry_point=TRLEnvAdapter, kwargs={"factory": factory}, disable_env_checker=True, order_enforce=False
    )
    return name
