"""How the episodes of a turn are stepped: one after another vs concurrently.

    python benchmarks/env_concurrency.py     # part of make bench; about 30 seconds

64 episodes of `starpo/Sleepy-v0` (every step waits 50 ms: a slow env, such as one behind a
server), reset, then one turn: every episode stepped once through the env runner the engine uses,
`inline` (one after another), `threads` or `processes` (concurrently); the turn's wall time
against one step's latency. Target: concurrent <= 3x one step's latency. Then env steps
per second of 64 Sokoban episodes (5 turns, one action each, threads) played in-process vs through
an OpenEnv server on 127.0.0.1 (`python -m envs.serve`, one session per episode).
Into results.json "env_concurrency" and BENCHMARKS.md.
"""

from __future__ import annotations

import pathlib
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

EPISODES = 64
LATENCY = 0.05


class InstantBackend:
    """Answers every prompt at once with the same reply."""

    def __init__(self, tokenizer, eos: int):
        self.reply = tokenizer("<think>x</think><answer>ok</answer>", add_special_tokens=False)["input_ids"] + [eos]

    def generate(self, sequences, max_new_tokens, temperature):
        return [(self.reply[:max_new_tokens], [0.0] * min(len(self.reply), max_new_tokens)) for _ in sequences]


def turn_seconds(runner: str, episodes: int = EPISODES, latency: float = LATENCY, repeats: int = 3) -> float:
    """The best of ``repeats`` wall times of one turn: every one of ``episodes`` sleepy episodes, already
    reset, stepped once through the env runner the engine uses (its thread pool started by the resets)."""
    from starpo_trl.rollout.env_runner import EnvRunner

    pool = EnvRunner(runner)
    best = float("inf")
    try:
        for _ in range(repeats):
            envs = pool.map(lambda i: pool.make("starpo/Sleepy-v0", {"latency": latency}), list(range(episodes)))
            pool.map(lambda env: env.reset(0), envs)
            start = time.perf_counter()
            steps = pool.map(lambda env: env.step("ok"), envs)
            best = min(best, time.perf_counter() - start)
            assert all(step[1] == 1.0 for step in steps), "a sleepy step failed"
            pool.map(lambda env: env.close(), envs)
            pool.release_threads()
    finally:
        pool.close()
    return best


def steps_per_second(env_id: str, env_kwargs: tuple = (), episodes: int = EPISODES) -> float:
    """Env steps per second of ``episodes`` episodes through the engine (threads), resets included."""
    from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState
    from starpo_trl.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()

    class Moves(InstantBackend):
        def __init__(self):
            self.calls = 0

        def generate(self, sequences, max_new_tokens, temperature):
            self.calls += 1
            reply = tok(f"<think>x</think><answer>{'UDLR'[self.calls % 4]}</answer>", add_special_tokens=False)
            ids = reply["input_ids"] + [tok.eos_token_id]
            return [(ids, [0.0] * len(ids)) for _ in sequences]

    cfg = RolloutConfig(max_turns=5, max_tokens_per_turn=32, env_runner="threads")
    engine = RolloutEngine(tok, None, cfg, [tok.eos_token_id])
    try:
        start = time.perf_counter()
        rollout = engine.run([StartState(env_id, i, env_kwargs) for i in range(episodes)], backend=Moves())
        seconds = time.perf_counter() - start
    finally:
        engine.close()
    assert not any(ep.env_error for ep in rollout), [ep.env_error for ep in rollout if ep.env_error][:1]
    return sum(ep.num_actions for ep in rollout) / seconds


def main() -> None:
    from report import store

    import envs  # noqa: F401  (registers starpo/Sleepy-v0)

    inline = turn_seconds("inline")
    threads = turn_seconds("threads")
    processes = turn_seconds("processes")
    result = {
        "episodes": EPISODES,
        "step_latency_s": LATENCY,
        "sequential_turn_s": round(inline, 3),
        "concurrent_turn_s": round(threads, 3),
        "processes_turn_s": round(processes, 3),
        "concurrent_over_latency": round(threads / LATENCY, 2),
        "target_met": threads <= 3 * LATENCY,
    }
    from local_server import local_server

    result["inprocess_steps_per_s"] = round(steps_per_second("starpo/Sokoban-v0"), 1)
    with local_server("starpo/Sokoban-v0") as (url, _):
        result["openenv_steps_per_s"] = round(steps_per_second("starpo/OpenEnv-v0", (("base_url", url),)), 1)
    print(result)
    store("env_concurrency", result, seeds=None)


if __name__ == "__main__":
    main()
