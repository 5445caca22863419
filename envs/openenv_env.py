"""A running OpenEnv server as a text env: ``starpo/OpenEnv-v0``.

## Description
Every episode opens its own session (WebSocket) on the server at ``base_url``, resets it with the
episode's seed and steps it with the agent's answers; ``close`` ends the session. Any OpenEnv
server works: ``observation_to_text`` turns its observation (a dict) into what the agent reads and
``action_to_payload`` the agent's answer into its action (a dict); both may be callables or
``"module:function"`` names. The defaults fit the servers of ``python -m envs.serve`` (observation
``text``, action ``{"text": ...}``), whose observations also carry the env's ``instructions``,
``action_names`` and the step's ``success`` / validity, read here when present.

A server that is down, drops the session or answers later than ``timeout_s`` makes the call raise;
the episode engine then ends that episode as an env error (``env_error_policy``, counted in
``env/errors``) and training goes on.

## Arguments
``base_url`` (e.g. ``"http://127.0.0.1:8000"``), ``observation_to_text=None``,
``action_to_payload=None``, ``instructions=""`` (when the server sends none), ``timeout_s=30.0``,
``connect_timeout_s=10.0``.

## Version history
v0: first version.
"""

from __future__ import annotations

import importlib
import json
import threading

from envs.base import TextEnv, step_info


def default_observation_text(observation: dict) -> str:
    """``observation["text"]`` when the server sends one, else the observation as JSON."""
    if "text" in observation:
        return str(observation["text"])
    return json.dumps(observation, sort_keys=True, default=str)


def default_action_payload(action: str) -> dict:
    return {"text": action}


def _resolve(fn, default):
    if fn is None:
        return default
    if callable(fn):
        return fn
    module, _, name = str(fn).partition(":")
    if not name:
        raise ValueError(f"{fn!r}: give a callable or a 'module:function' name")
    return getattr(importlib.import_module(module), name)


class OpenEnvTextEnv(TextEnv):
    def __init__(
        self,
        base_url: str = "",
        observation_to_text=None,
        action_to_payload=None,
        instructions: str = "",
        timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode)
        if not base_url:
            raise ValueError('starpo/OpenEnv-v0 needs base_url, the server\'s address, e.g. "http://127.0.0.1:8000".')
        try:
            from openenv.core.generic_client import GenericEnvClient  # noqa: F401
        except ImportError:
            raise ImportError("starpo/OpenEnv-v0 needs openenv-core: pip install 'starpo-trl[openenv]'.") from None
        self.base_url, self.timeout_s, self.connect_timeout_s = base_url, timeout_s, connect_timeout_s
        self.to_text = _resolve(observation_to_text, default_observation_text)
        self.to_payload = _resolve(action_to_payload, default_action_payload)
        self.default_instructions = self.instructions = instructions
        self.client = None
        self.broken = False  # a call failed or timed out: the session is not closed politely
        self.text = ""

    def _session(self):
        if self.client is None:
            from openenv.core.generic_client import GenericEnvClient

            client = GenericEnvClient(
                base_url=self.base_url, connect_timeout_s=self.connect_timeout_s, message_timeout_s=self.timeout_s
            ).sync()
            try:
                client.connect()
            except BaseException:  # no session: stop the client's event-loop thread too, or one leaks per episode
                _close_quietly(client)
                raise
            self.client = client
        return self.client

    def _read(self, result) -> dict:
        observation = dict(result.observation or {})
        self.text = self.to_text(observation)
        self.instructions = str(observation.get("instructions") or self.default_instructions)
        names = observation.get("action_names")
        self.action_names = None if names is None else [str(n) for n in names]
        return observation

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        observation = self._read(self._call(lambda client: client.reset(seed=self.new_episode_seed(seed))))
        return self.text, step_info(bool(observation.get("success", False)), True, False)

    def step(self, action):
        if self.client is None:
            raise RuntimeError("step before reset: no session is open")
        result = self._call(lambda client: client.step(self.to_payload(action)))
        observation = self._read(result)
        truncated = bool(observation.get("truncated", False))
        info = step_info(
            bool(observation.get("success", False)),
            bool(observation.get("action_is_valid", True)),
            bool(observation.get("action_is_effective", True)),
        )
        return self.text, float(result.reward or 0.0), bool(result.done) and not truncated, truncated, info

    def _call(self, fn):
        try:
            return fn(self._session())
        except Exception:
            self.broken = True
            raise

    def render_text(self) -> str:
        return self.text

    def close(self):
        client, self.client = self.client, None
        if client is not None:
            if self.broken:  # a server still busy with a timed-out call may not answer the close: do not wait for it
                threading.Thread(target=_close_quietly, args=(client,), daemon=True).start()
            else:
                _close_quietly(client)
        super().close()


def _close_quietly(client) -> None:
    try:
        client.close()
    except Exception:  # the server may be gone already
        pass
