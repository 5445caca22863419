"""Env speed: resets/s and steps/s per registered env, on one core. Target: 6x6 Sokoban >= 200 resets/s.

python benchmarks/env_speed.py            # prints a table, stores it in benchmarks/results.json + BENCHMARKS.md
"""

import time

import gymnasium as gym

import envs  # noqa: E402


def rate(fn, n):
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def main():
    results = {}
    for env_id in envs.ENV_IDS:
        env = gym.make(env_id).unwrapped
        resets = rate(lambda i: env.reset(seed=i), 300)
        env.reset(seed=0)
        names = env.action_names or ["1 + 2"]

        def step(i):
            _, _, term, trunc, _ = env.step(names[i % len(names)])
            if term or trunc:
                env.reset(seed=i)

        steps = rate(step, 2000)
        results[env_id] = {"resets_per_s": round(resets, 1), "steps_per_s": round(steps, 1)}
        print(f"{env_id:28s} {resets:10.0f} resets/s {steps:10.0f} steps/s")
    sokoban = results["starpo/Sokoban-v0"]["resets_per_s"]
    print(f"Sokoban 6x6 resets/s: {sokoban:.0f} (target >= 200): {'OK' if sokoban >= 200 else 'BELOW TARGET'}")
    from report import store

    store("envs", {"per_env": results, "sokoban_target_met": sokoban >= 200}, seeds=range(300))


if __name__ == "__main__":
    main()
