"""Shared pieces of every text environment: the `TextEnv` base class and action matching.

A text environment is a Gymnasium env whose observations and actions are strings. Besides the
Gymnasium API it has two attributes the trainer reads:

- ``instructions``: the rules, the symbol legend and the answer format, shown once per episode.
- ``action_names``: the named actions (matched case-insensitively after stripping whitespace), or
  ``None`` when the answer is free text (Countdown, Arithmetic).

``info`` always carries ``success`` (the env's own goal was reached), ``action_is_valid`` and
``action_is_effective`` (the state changed). An unknown action is never an error: the state stays,
``action_is_valid`` is False and the step still counts against ``max_steps``.
"""

from __future__ import annotations

import string

import gymnasium as gym
import numpy as np
from gymnasium import spaces

# Every character an env may print or accept. Gymnasium's Text space checks membership per character.
CHARSET = frozenset(string.printable) | frozenset("√█·")
MAX_TEXT = 8192


def text_space(max_length: int = MAX_TEXT) -> spaces.Text:
    return spaces.Text(max_length=max_length, min_length=0, charset=CHARSET)


def step_info(success: bool, valid: bool, effective: bool, **extra) -> dict:
    return {"success": bool(success), "action_is_valid": bool(valid), "action_is_effective": bool(effective), **extra}


class TextEnv(gym.Env):
    """Base class: string observations, string actions, ``ansi`` render, seeded start states."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    instructions: str = ""
    action_names: list[str] | None = None

    def __init__(self, render_mode: str | None = None):
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = text_space()
        self.action_space = text_space(256)

    # -- actions -----------------------------------------------------------------------------------
    def match_action(self, action: str) -> int | None:
        """Index of ``action`` in ``action_names`` (case-insensitive, whitespace stripped), else None."""
        if self.action_names is None or not isinstance(action, str):
            return None
        key = action.strip().lower()
        for i, name in enumerate(self.action_names):
            if name.lower() == key:
                return i
        return None

    def new_episode_seed(self, seed: int | None) -> int:
        """The seed that decides the start state: the given one, or a draw from the env's own stream."""
        if seed is not None:
            return int(seed)
        return int(self.np_random.integers(0, 2**31 - 1))

    def state_key(self):
        """A hashable key of the current state, equal for equal states of the same start state (GiGPO's anchor
        states). None (the default): the trainer compares the observation text instead."""
        return None

    # -- to implement --------------------------------------------------------------------------------
    def render_text(self) -> str:
        raise NotImplementedError

    def expert_action(self) -> str:
        """The optimal action (or answer) from the current state."""
        raise NotImplementedError

    def expert_thought(self) -> str | None:
        """What the expert reads off the current state before it acts, one or two sentences (the warm
        start's ``warm_start_think: state``), or None where it has nothing to say beyond the action."""
        return None

    def render(self):
        if self.render_mode == "ansi":
            return self.render_text()
        return None


def noisy_expert_action(env: TextEnv, noise: float, rng: np.random.Generator) -> str:
    """The expert's action, replaced with probability ``noise`` by a uniformly random named action.

    Free-text envs have no named actions; there the noisy answer is the expert answer with one
    digit changed, so demonstrations can contain wrong answers too.
    """
    expert = env.unwrapped if hasattr(env, "unwrapped") else env
    action = expert.expert_action()
    if noise <= 0 or rng.random() >= noise:
        return action
    if expert.action_names:
        return str(expert.action_names[int(rng.integers(len(expert.action_names)))])
    digits = [i for i, c in enumerate(action) if c.isdigit()]
    if not digits:
        return action
    i = digits[int(rng.integers(len(digits)))]
    new_digit = str((int(action[i]) + 1 + int(rng.integers(9))) % 10)
    return action[:i] + new_digit + action[i + 1 :]


def value_iteration(P: dict, n_states: int, n_actions: int, gamma: float = 0.99, tol: float = 1e-10) -> np.ndarray:
    """Greedy policy from value iteration on a Gymnasium toy-text transition table ``P[s][a]``.

    ``P[s][a]`` is a list of ``(prob, next_state, reward, terminated)``. Returns one action per state;
    ties are broken towards the lowest action index so the policy is deterministic.
    """
    T = np.zeros((n_states, n_actions, n_states))  # probability of s -> s2 that continues
    R = np.zeros((n_states, n_actions))  # expected immediate reward
    for s in range(n_states):
        for a in range(n_actions):
            for p, s2, r, done in P[s][a]:
                R[s, a] += p * r
                if not done:
                    T[s, a, s2] += p
    V = np.zeros(n_states)
    for _ in range(100_000):
        Q = R + gamma * T @ V
        V_new = Q.max(axis=1)
        if np.max(np.abs(V_new - V)) < tol:
            break
        V = V_new
    return np.argmax(np.round(Q, 9), axis=1)
