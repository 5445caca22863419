"""Any registered text env as a TRL environment: ``GRPOTrainer(environment_factory=trl_environment(...))``.

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

import gymnasium as gym

import envs  # noqa: F401  (registers the envs)
from envs.contract import env_name


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
            notes = [] if info.get("action_is_valid", True) else [f"{action!r} is not a valid action."]
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
