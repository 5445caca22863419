"""A stand-in for a slow env (a server behind a socket, a simulator): every ``step`` waits.

## Description
One turn of nothing: ``step`` sleeps ``latency`` seconds, then ends the episode with reward 1 for
any action. Used to measure how the episodes of a turn are stepped (``env_runner``: one after
another, on threads, in processes); not a task to learn.

## Arguments
``latency=0.05`` seconds per step.

## Version history
v0: first version.
"""

from __future__ import annotations

import time

from envs.base import TextEnv, step_info


class SleepyEnv(TextEnv):
    instructions = "Answer anything."

    def __init__(self, latency: float = 0.05, render_mode: str | None = None):
        super().__init__(render_mode)
        if latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, got {latency}")
        self.latency = latency

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.render_text(), step_info(False, True, False)

    def step(self, action):
        time.sleep(self.latency)
        return self.render_text(), 1.0, True, False, step_info(True, True, True)

    def render_text(self) -> str:
        return "Waiting."

    def expert_action(self) -> str:
        return "ok"
