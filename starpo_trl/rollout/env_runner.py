"""Where env calls run: in the trainer's process, on threads, or in worker processes.

The episode engine talks to every env through a handle with ``reset(seed)``, ``step(action)``,
``match_action(action)``, ``close()`` and the attributes ``instructions`` / ``action_names`` /
``tool_schemas`` (a TRL-style env's tools, else None)
(refreshed after each reset). ``EnvRunner`` makes the handles and steps the active episodes of a
turn:

- ``inline``: envs in the trainer's process, stepped one episode after another (no overhead).
- ``threads``: envs in the trainer's process, the episodes of a turn stepped concurrently on a
  thread pool. For I/O-bound envs (a server behind a socket). No timeout: a thread cannot be stopped.
- ``processes``: each env lives in its own worker process (forked, so envs registered at runtime
  are there too), the episodes of a turn stepped concurrently. A call that takes longer than
  ``timeout`` seconds kills its worker (the episode ends as an env error); a dead worker is
  replaced on the next episode. Nothing of a hung or busy-looping env survives in the trainer's
  process, and timeouts overlap instead of adding up one episode at a time. Workers are reused
  across rollouts.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym

RUNNERS = ("inline", "threads", "processes")


class EnvCallError(RuntimeError):
    """An env call failed in a worker process; the message is the env's own ``Type: message``."""


def _describe(env) -> tuple[str, list[str] | None, list[dict] | None]:
    inner = env.unwrapped
    names = getattr(inner, "action_names", None)
    tools = getattr(inner, "tool_schemas", None)
    return str(getattr(inner, "instructions", "")), (None if names is None else list(names)), tools


def _state_key(env):
    """The env's ``state_key()`` (GiGPO's anchor state), or None when it has none."""
    key = getattr(env.unwrapped, "state_key", None)
    return key() if callable(key) else None


class LocalEnv:
    """An env in this process."""

    def __init__(self, env_id: str, env_kwargs: dict):
        self.env = gym.make(env_id, **env_kwargs)
        self.instructions, self.action_names, self.tool_schemas = _describe(self.env)

    @property
    def unwrapped(self):
        return self

    def reset(self, seed: int):
        out = self.env.reset(seed=seed)
        self.instructions, self.action_names, self.tool_schemas = _describe(self.env)
        return out

    def step(self, action: str):
        return self.env.step(action)

    def match_action(self, action: str):
        return self.env.unwrapped.match_action(action)

    def state_key(self):
        return _state_key(self.env)

    def close(self):
        self.env.close()


def _serve(conn) -> None:
    """A worker process: one env at a time, commands from the pipe, ``(ok, value)`` back."""
    env = None
    while True:
        try:
            command, *args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if command == "make":
                env = gym.make(args[0], **args[1])
                value = _describe(env)
            elif command == "reset":
                obs, info = env.reset(seed=args[0])
                value = (obs, info, _describe(env))
            elif command == "step":
                value = env.step(args[0])
            elif command == "match":
                value = env.unwrapped.match_action(args[0])
            elif command == "state_key":
                value = _state_key(env)
            elif command == "close":
                if env is not None:
                    env.close()
                env = value = None
            else:  # "exit"
                return
            conn.send(("ok", value))
        except Exception as err:  # the env's failure goes back to the trainer as text
            try:
                conn.send(("error", f"{type(err).__name__}: {err}"))
            except Exception:
                return


class _Worker:
    def __init__(self, context):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def kill(self):
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class ProcessEnv:
    """An env in a worker process; every call waits at most ``timeout`` seconds."""

    def __init__(self, runner: EnvRunner, worker: _Worker, env_id: str, env_kwargs: dict):
        self.runner, self.worker = runner, worker
        self.instructions, self.action_names, self.tool_schemas = self._call("make", env_id, env_kwargs)

    @property
    def unwrapped(self):
        return self

    def _call(self, *message):
        if self.worker is None:
            raise EnvCallError("the env's worker process was stopped earlier in this episode")
        timeout = self.runner.timeout
        try:
            self.worker.conn.send(message)
            answered = self.worker.conn.poll(timeout)
            if answered:
                status, value = self.worker.conn.recv()
        except (EOFError, OSError) as err:
            self._discard()
            raise EnvCallError(f"the env's worker process died ({type(err).__name__})") from None
        if not answered:
            self._discard()
            raise TimeoutError(f"took longer than env_step_timeout={timeout}s (its worker process was killed)")
        if status == "error":
            raise EnvCallError(value)
        return value

    def _discard(self):
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.kill()

    def reset(self, seed: int):
        obs, info, (self.instructions, self.action_names, self.tool_schemas) = self._call("reset", seed)
        return obs, info

    def step(self, action: str):
        return self._call("step", action)

    def match_action(self, action: str):
        return self._call("match", action)

    def state_key(self):
        return self._call("state_key")

    def close(self):
        if self.worker is None:
            return
        try:
            self._call("close")
        except Exception:  # a failing close loses nothing: the episode is recorded
            self._discard()
            return
        self.runner._idle.append(self.worker)
        self.worker = None


class EnvRunner:
    """Makes env handles and runs per-episode work for one rollout after another.

    ``mode``: ``inline``, ``threads`` or ``processes`` (see the module docstring); ``timeout``
    (seconds per env call) needs ``processes``; ``max_workers`` bounds the threads stepping a turn
    (default: one per active episode).
    """

    def __init__(self, mode: str = "inline", timeout: float | None = None, max_workers: int | None = None):
        if mode not in RUNNERS:
            raise ValueError(f"env_runner must be one of {RUNNERS}, got {mode!r}")
        if timeout is not None and mode != "processes":
            raise ValueError(
                f"env_step_timeout needs env_runner='processes' (got {mode!r}): only a worker process can be stopped "
                "when an env call hangs."
            )
        self.mode, self.timeout, self.max_workers = mode, timeout, max_workers
        self._idle: list[_Worker] = []
        # kept across the calls of one rollout (reset, every turn, close): starting 64 threads for each
        # call costs more than a fast env's step; released by ``release_threads`` when the rollout ends
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._lock = threading.Lock()
        self._context = None
        if mode == "processes":
            # tokenizers would warn in every forked worker otherwise; the engine encodes one message at a time
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            methods = multiprocessing.get_all_start_methods()
            self._context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")

    def make(self, env_id: str, env_kwargs: dict):
        if self.mode != "processes":
            return LocalEnv(env_id, env_kwargs)
        with self._lock:  # forks one at a time: a fork while another worker starts would inherit its pipe ends
            worker = self._idle.pop() if self._idle else None
            if worker is None or not worker.process.is_alive():
                worker = _Worker(self._context)
        return ProcessEnv(self, worker, env_id, env_kwargs)

    def map(self, fn, items: list) -> list:
        """``[fn(x) for x in items]``, concurrently unless ``inline``; ``fn`` handles its own errors."""
        if self.mode == "inline" or len(items) <= 1:
            return [fn(x) for x in items]
        workers = self.max_workers or len(items)
        if self._pool is None or self._pool_size < workers:  # grows to the largest turn seen
            if self._pool is not None:
                self._pool.shutdown(wait=True)  # idle between calls: its threads end at once
            self._pool, self._pool_size = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="env"), workers
        return list(self._pool.map(fn, items))

    def release_threads(self) -> None:
        """Let the thread pool's threads end (the next ``map`` starts a new pool): no thread outlives a rollout."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool, self._pool_size = None, 0

    def close(self) -> None:
        """Stop the idle worker processes (busy ones were killed or returned already) and the thread pool."""
        self.release_threads()
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            try:
                worker.conn.send(("exit",))
            except Exception:
                pass
            worker.kill()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
