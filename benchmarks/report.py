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
        lines += [f"## Environment speed (`python benchmarks/envs.py`, {r['machine']}, {r['measured_at']})", "",
                  "| env | resets/s | steps/s |", "|---|---|---|"]
        lines += [f"| `{k}` | {v['resets_per_s']:.0f} | {v['steps_per_s']:.0f} |" for k, v in r["per_env"].items()]
        lines += ["", f"Target: 6x6 Sokoban resets >= 200/s on one core: **{'met' if r['sokoban_target_met'] else 'NOT met'}**.", ""]
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
