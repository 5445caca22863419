"""A turn's episodes are stepped concurrently on threads and in processes; the thread pool is kept
across the turns of a rollout (starting threads for every call cost more than a fast env's step)
and released when the rollout ends."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))

import envs  # noqa: E402,F401
from envs.contract import check_env_contract  # noqa: E402
from starpo_trl.rollout.env_runner import EnvRunner  # noqa: E402


def test_sleepy_env_keeps_the_contract():
    check_env_contract("starpo/Sleepy-v0", {"latency": 0.0})
    with pytest.raises(ValueError, match="latency"):
        check_env_contract("starpo/Sleepy-v0", {"latency": -1.0})


def test_a_turn_of_slow_envs_takes_about_one_step_concurrently():
    from env_concurrency import turn_seconds

    latency, n = 0.05, 16
    sequential = turn_seconds("inline", n, latency, repeats=1)
    assert sequential >= n * latency  # one after another: every wait adds up
    for runner in ("threads", "processes"):
        concurrent = turn_seconds(runner, n, latency, repeats=2)
        assert concurrent < sequential / 3, (runner, concurrent, sequential)  # 16 waits overlap


def test_the_thread_pool_is_kept_within_a_rollout_and_released_after():
    import threading

    before = {t.name for t in threading.enumerate()}
    runner = EnvRunner("threads")
    assert runner.map(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6]
    pool = runner._pool
    runner.map(lambda x: x, [1, 2])
    assert runner._pool is pool  # the same threads next turn
    runner.map(lambda x: x, list(range(5)))
    assert runner._pool is not pool and runner._pool_size == 5  # a larger turn: a larger pool
    runner.release_threads()  # the engine does this when a rollout ends
    assert runner._pool is None and {t.name for t in threading.enumerate()} <= before
