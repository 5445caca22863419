"""Turn any Gymnasium env with a ``Discrete`` action space and an ``ansi`` render into a text env.

The observation is the env's ``ansi`` render with colour escape codes removed (plus an optional
line from ``describe_fn`` for what the render only showed in colour); the actions are the
names you give, in the order of the env's action indices. ``success`` is decided by a function of
``(reward, terminated, info)`` (default: terminated with a positive reward). When the wrapped env
exposes a transition table ``P`` (Gymnasium's toy-text envs do), the expert is the greedy policy
of value iteration on it.

Registered with this wrapper: ``starpo/Taxi-v0`` (Gymnasium's Taxi-v4) and
``starpo/CliffWalking-v0`` (Gymnasium's CliffWalking-v1).

Example::

    env = gymnasium.make("starpo/Taxi-v0")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("North")
"""

from __future__ import annotations

import re
from typing import Callable

import gymnasium as gym
from gymnasium import spaces

from envs.base import TextEnv, step_info, value_iteration

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def default_success(reward: float, terminated: bool, info: dict) -> bool:
    return bool(terminated and reward > 0)


class GymTextEnv(TextEnv):
    def __init__(
        self,
        env_id: str,
        action_names: list[str],
        instructions: str = "",
        success_fn: Callable[[float, bool, dict], bool] = default_success,
        describe_fn: Callable[[gym.Env, int], str] | None = None,
        max_steps: int = 100,
        render_mode: str | None = None,
        **env_kwargs,
    ):
        super().__init__(render_mode)
        self.env = gym.make(env_id, render_mode="ansi", **env_kwargs).unwrapped
        if not isinstance(self.env.action_space, spaces.Discrete):
            raise ValueError(f"{env_id} needs a Discrete action space, has {self.env.action_space}")
        if len(action_names) != self.env.action_space.n:
            raise ValueError(f"{env_id} has {self.env.action_space.n} actions; got {len(action_names)} names")
        self.env_id = env_id
        self.action_names = list(action_names)
        self.success_fn = success_fn
        self.describe_fn = describe_fn
        self.max_steps = max_steps
        self.instructions = (instructions + " " if instructions else "") + f"Actions: {', '.join(self.action_names)}."
        self._policy = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.state, _ = self.env.reset(seed=self.new_episode_seed(seed))
        self.steps = 0
        self.done = False
        return self.render_text(), step_info(False, True, False)

    def step(self, action: str):
        self.steps += 1
        idx = self.match_action(action)
        reward, terminated, success, effective = 0.0, self.done, False, False
        if idx is not None and not self.done:
            state, reward, terminated, _, info = self.env.step(idx)
            effective = state != self.state
            self.state = state
            success = self.success_fn(float(reward), bool(terminated), info)
            self.done = bool(terminated)
        truncated = not terminated and self.steps >= self.max_steps
        return (
            self.render_text(),
            float(reward),
            bool(terminated),
            truncated,
            step_info(success, idx is not None, effective),
        )

    def render_text(self) -> str:
        text = ANSI_ESCAPE.sub("", self.env.render()).rstrip("\n")
        if self.describe_fn is not None:  # for what the render only showed in colour
            text += "\n" + self.describe_fn(self.env, int(self.state))
        return text

    def expert_action(self) -> str:
        if not hasattr(self.env, "P"):
            raise NotImplementedError(f"{self.env_id} has no transition table P; give an expert of your own")
        if self._policy is None:
            self._policy = value_iteration(self.env.P, self.env.observation_space.n, self.env.action_space.n)
        return self.action_names[int(self._policy[int(self.state)])]


TAXI_LOCATIONS = ["R", "G", "Y", "B"]


def describe_taxi(env: gym.Env, state: int) -> str:
    row, col, passenger, destination = env.decode(state)
    where = "in the taxi" if passenger == 4 else f"at {TAXI_LOCATIONS[passenger]}"
    return f"Taxi at row {row}, column {col}. Passenger {where}. Destination {TAXI_LOCATIONS[destination]}."


def taxi(**kwargs) -> GymTextEnv:
    return GymTextEnv(
        "Taxi-v4",
        ["South", "North", "East", "West", "Pickup", "Dropoff"],
        instructions=(
            "You drive a taxi on a grid (row 0 at the top, column 0 at the left). Pick up the passenger and "
            "drop them off at the destination; R, G, Y, B are the four stops. Walls (|) block moves. Rewards: -1 per step, +20 for a drop-off at the "
            "destination, -10 for an illegal pickup or drop-off."
        ),
        success_fn=lambda r, t, i: bool(t and r == 20),
        describe_fn=describe_taxi,
        **kwargs,
    )


def cliff_walking(**kwargs) -> GymTextEnv:
    return GymTextEnv(
        "CliffWalking-v1",
        ["Up", "Right", "Down", "Left"],
        instructions=(
            "You (x) walk along a cliff to the goal (T) without stepping on the cliff (C); o is safe ground. "
            "Rewards: -1 per step, -100 for stepping on the cliff (back to the start)."
        ),
        success_fn=lambda r, t, i: bool(t),
        **kwargs,
    )
