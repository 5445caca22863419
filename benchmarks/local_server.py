"""Serve a registered env over OpenEnv's HTTP in a child process on a free local port, for as long as a ``with``
block runs: ``with local_server("starpo/Sokoban-v0") as (url, process): ...`` (``python -m envs.serve``; needs
``openenv-core``). The call returns once the server answers ``/health``, and the server is always stopped. Used by
``env_concurrency.py`` and the tests (the library itself starts no process: tests/rollout/test_reliability.py)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

PACKAGE_PARENT = pathlib.Path(__file__).resolve().parents[1]  # the checkout: where ``envs`` is importable from


@contextlib.contextmanager
def local_server(env_id: str, env_kwargs: str = "{}", log: pathlib.Path | None = None, start_timeout: float = 300.0):
    """``(url, process)`` of a running server for ``env_id`` (``env_kwargs``: a JSON object). ``log``: a file for
    the server's stderr. A busy machine can take minutes to import and start it: it is polled until it answers
    or ``start_timeout`` seconds pass (then ``RuntimeError``, as when it exits)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "envs.serve", env_id, "--port", str(port), "--env_kwargs", env_kwargs]
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_PARENT), "OMP_NUM_THREADS": "1"}
    err = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(cmd, cwd=PACKAGE_PARENT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=5)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {proc.returncode}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not come up within {start_timeout:g} s") from None
                time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(3)  # a server busy with a slow step may not stop at once: then it is killed
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log is not None:
            err.close()
