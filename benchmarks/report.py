"""benchmarks/results.json -> BENCHMARKS.md. Each benchmark script stores its section and calls `write`."""

from __future__ import annotations

import json
import pathlib
import platform
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
MARKDOWN = ROOT / "BENCHMARKS.md"


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def store(key: str, value) -> dict:
    results = load()
    results[key] = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), **value}
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    write(results)
    return results


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"


def write(results: dict) -> None:
    lines = ["# Benchmarks", "", "Written by the scripts in `benchmarks/` from `benchmarks/results.json`; do not edit by hand.", ""]
    if "envs" in results:
        r = results["envs"]
        lines += [f"## Environment speed (`python benchmarks/env_speed.py`, {r['machine']}, {r['measured_at']})", "",
                  "| env | resets/s | steps/s |", "|---|---|---|"]
        lines += [f"| `{k}` | {v['resets_per_s']:.0f} | {v['steps_per_s']:.0f} |" for k, v in r["per_env"].items()]
        lines += ["", f"Target: 6x6 Sokoban resets >= 200/s on one core: **{'met' if r['sokoban_target_met'] else 'NOT met'}**.", ""]
    if "speed" in results:
        r = results["speed"]
        check = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        lines += [f"## Speed (`python benchmarks/speed.py`, {r['machine']}, {r['measured_at']})", "",
                  f"Model: {r['model']}. Each ratio is measured side by side in one run (median of repeats).", "",
                  "| measure | value | target |", "|---|---|---|",
                  f"| rollout_overhead_ratio (engine / bare `model.generate` on the same inputs, 32 episodes x 5 turns) | {r['rollout_overhead_ratio']:.2f} | <= 1.10: {check(r['rollout_overhead_ratio'] <= 1.10)} |",
                  f"| batched_vs_sequential_speedup (same 32 episodes) | {r['batched_vs_sequential_speedup']:.1f} | >= 5: {check(r['batched_vs_sequential_speedup'] >= 5)} |",
                  f"| step_time_ratio_vs_trl_grpo (per model token, single-turn Bandit) | {r['step_time_ratio_vs_trl_grpo']:.2f} | <= 1.15: {check(r['step_time_ratio_vs_trl_grpo'] <= 1.15)} |",
                  f"| peak RSS of a shortened CPU demo run (MiB) | {r['demo_peak_rss_mib']:.0f} | |", "",
                  f"Step seconds: {r['step_seconds']}; mean completion tokens: {r['mean_completion_tokens']}.", "",
                  "Prefill tokens per episode at each turn (the HF backend re-reads the whole history every turn; "
                  "no KV-cache reuse across turns yet, so there is no reuse gain to report): "
                  + ", ".join(f"turn {i + 1}: {v:.0f}" for i, v in enumerate(r["prefill_tokens_per_episode_by_turn"])) + ".", ""]
    if "critic_memory" in results:
        r = results["critic_memory"]
        lines += [f"## Critic memory (`python benchmarks/critic_memory.py`, {r['machine']}, {r['measured_at']})", "",
                  f"Peak resident memory of {r['steps']} training steps of a LoRA policy ({r['model']}) on "
                  f"`{r['env_id']}`, each run in its own process, side by side:", "",
                  "| advantage estimator / critic | peak RSS (MiB) |", "|---|---|"]
        lines += [f"| {name} | {mb:.0f} |" for name, mb in r["peak_rss_mib"].items()]
        lines += ["", f"LoRA critic / full critic peak memory: **{r['lora_vs_full_ratio']:.2f}**; "
                  f"extra memory over no critic: LoRA {r['lora_extra_mib']:.0f} MiB, full {r['full_extra_mib']:.0f} MiB.", ""]
    MARKDOWN.write_text("\n".join(lines))
