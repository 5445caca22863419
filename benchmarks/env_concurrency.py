"""How the episodes of a turn are stepped: one after another vs concurrently.

    python benchmarks/env_concurrency.py     # part of make bench; about 30 seconds

64 episodes of `starpo/Sleepy-v0` (every step waits 50 ms: a slow env, such as one behind a
server) play one turn through the episode engine (a backend that answers at once), with
`env_runner` `inline` (one after another), `threads` and `processes` (concurrently); the turn's
wall time against one step's latency. Target: concurrent <= 3x one step's latency. Also the
in-process steps per second of the same env on threads. `openenv_steps_per_s` stays null until
the OpenEnv adapter exists. Into results.json "env_concurrency" and BENCHMARKS.md.
"""

from __future__ import annotations

import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

EPISODES = 64
LATENCY = 0.05


class InstantBackend:
    """Answers every prompt at once with the same reply."""

    def __init__(self, tokenizer, eos: int):
        self.reply = tokenizer("<think>x</think><answer>ok</answer>", add_special_tokens=False)["input_ids"] + [eos]

    def generate(self, sequences, max_new_tokens, temperature):
        return [(self.reply[:max_new_tokens], [0.0] * min(len(self.reply), max_new_tokens)) for _ in sequences]


def turn_seconds(runner: str, episodes: int = EPISODES, latency: float = LATENCY, repeats: int = 3) -> float:
    """The best of ``repeats`` wall times of one engine rollout (reset + one turn) of ``episodes`` sleepy episodes."""
    from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState
    from starpo_trl.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    cfg = RolloutConfig(max_turns=1, max_tokens_per_turn=32, env_runner=runner)
    engine = RolloutEngine(tok, None, cfg, [tok.eos_token_id])
    backend = InstantBackend(tok, tok.eos_token_id)
    starts = [StartState("starpo/Sleepy-v0", i, (("latency", latency),)) for i in range(episodes)]
    best = float("inf")
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            rollout = engine.run(starts, backend=backend)
            best = min(best, time.perf_counter() - start)
            assert all(ep.success for ep in rollout), "a sleepy episode failed"
    finally:
        engine.close()
    return best


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
        "inprocess_steps_per_s": round(EPISODES / threads, 1),
        "openenv_steps_per_s": None,
    }
    print(result)
    store("env_concurrency", result)


if __name__ == "__main__":
    main()
