"""Any registered text env as an OpenEnv server (``openenv-core``; ``pip install 'starpo-trl[openenv]'``).

    python -m envs.serve starpo/Sokoban-v0 --port 8000 [--env_kwargs '{"dim_room": [8, 8]}'] [--max_sessions 64]

Each client session (WebSocket) gets its own env instance; a stock OpenEnv client plays it
(``GenericEnvClient(base_url="http://127.0.0.1:8000")``, actions ``{"text": "Up"}``), and so does
``starpo/OpenEnv-v0`` (``envs.openenv_env``) for training here. An observation carries the env's
text (``text``), its ``instructions`` and ``action_names``, the step's ``success`` /
``action_is_valid`` / ``action_is_effective``, ``truncated``, and OpenEnv's ``reward`` / ``done``.
"""

from __future__ import annotations

import argparse
import json
import uuid

import gymnasium as gym
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

import envs  # noqa: F401  (registers the envs)


class TextAction(Action):
    text: str = Field(..., description="The agent's answer: an action name, or free text")


class TextObservation(Observation):
    text: str = Field(default="", description="What the agent sees now")
    instructions: str = Field(default="", description="The env's rules and answer format")
    action_names: list[str] | None = Field(default=None, description="Named actions, or None for free text")
    success: bool = Field(default=False, description="The episode's task is solved")
    action_is_valid: bool = Field(default=True, description="The last action was one the env accepts")
    action_is_effective: bool = Field(default=False, description="The last action changed the state")
    truncated: bool = Field(default=False, description="Ended by a step limit, not by the task")


def text_environment(env_id: str, env_kwargs: dict | None = None) -> type[Environment]:
    """An OpenEnv ``Environment`` class serving ``gymnasium.make(env_id, **env_kwargs)``, one instance per session."""
    kwargs = dict(env_kwargs or {})
    gym.make(env_id, **kwargs).close()  # a bad id or kwargs fail here, before the server starts

    class TextEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True  # every session builds its own env: nothing is shared

        def __init__(self):
            super().__init__()
            self.env = gym.make(env_id, **kwargs)
            self._state = State(episode_id=None, step_count=0)

        def _observation(self, text, info, reward=None, done=False, truncated=False) -> TextObservation:
            inner = self.env.unwrapped
            names = getattr(inner, "action_names", None)
            return TextObservation(
                text=str(text),
                instructions=str(getattr(inner, "instructions", "")),
                action_names=None if names is None else [str(n) for n in names],
                success=bool(info.get("success", False)),
                action_is_valid=bool(info.get("action_is_valid", True)),
                action_is_effective=bool(info.get("action_is_effective", False)),
                truncated=bool(truncated),
                reward=reward,
                done=bool(done),
            )

        def reset(self, seed=None, episode_id=None, **_) -> TextObservation:
            text, info = self.env.reset(seed=seed)
            self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
            return self._observation(text, info)

        def step(self, action: TextAction, timeout_s=None, **_) -> TextObservation:
            text, reward, terminated, truncated, info = self.env.step(action.text)
            self._state.step_count += 1
            return self._observation(text, info, float(reward), terminated or truncated, truncated)

        @property
        def state(self) -> State:
            return self._state

        def close(self) -> None:
            self.env.close()

    TextEnvironment.__name__ = f"TextEnvironment[{env_id}]"
    return TextEnvironment


class QuietClientClose:
    """ASGI middleware: a ``WebSocketDisconnect`` that escapes a WebSocket session is the client having
    left (openenv-core 0.3's handler closes the socket again after a normal client close and catches only
    ``RuntimeError``), not a server error; without this every episode's close logs a ~60-line traceback.
    Any other exception, and every HTTP request, passes through untouched."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


def make_app(env_id: str, env_kwargs: dict | None = None, max_sessions: int = 64):
    """The FastAPI app (``/ws`` sessions, ``/reset``, ``/step``, ``/state``, ``/schema``, ``/health``)."""
    app = create_app(
        text_environment(env_id, env_kwargs),
        TextAction,
        TextObservation,
        env_name=env_id.split("/")[-1],
        max_concurrent_envs=max_sessions,
    )
    app.add_middleware(QuietClientClose)
    return app


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_id")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--env_kwargs", default="{}", help="JSON object of kwargs for gymnasium.make")
    parser.add_argument("--max_sessions", type=int, default=64, help="concurrent client sessions")
    a = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(
        make_app(a.env_id, json.loads(a.env_kwargs), a.max_sessions), host=a.host, port=a.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
