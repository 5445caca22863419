"""benchmarks/results.json -> BENCHMARKS.md: what the product measures (speed, memory, envs, the CPU demo).

Each benchmark script stores its section with `store` (stamped with its provenance) and BENCHMARKS.md and README's
tables are rendered again. The stamping and storing (`save`, `provenance`) and the shared pieces of rendering
(`stamp`, `wrapped`, `render_readme`, `one`) serve experiments/report.py too."""

from __future__ import annotations

import json
import pathlib
import platform
import statistics
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


def read(path: pathlib.Path) -> dict:
    """A results file's sections ({} before the first is stored)."""
    return json.loads(path.read_text()) if path.exists() else {}


def load() -> dict:
    return read(RESULTS)


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
WRITTEN = (
    "benchmarks/results.json",
    "BENCHMARKS.md",
    "README.md",
    "experiments/results.json",
    "experiments/README.md",
)


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
        "command": command or " ".join(invocation()),
        "seeds": list(seeds) if seeds is not None else None,
        "machine": machine(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "wall_seconds": round(wall_seconds, 1),
    }


def invocation() -> list[str]:
    """This process's command line, paths relative to the checkout; an experiment runs as a module of it
    (``python -m experiments.NAME``), which ``sys.argv`` shows as the file's path."""
    args = [_relative(a) for a in sys.argv]
    script = pathlib.Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if script is not None and script.parent == ROOT / "experiments":
        return ["python", "-m", f"experiments.{script.stem}", *args[1:]]
    return ["python", *args]


def _relative(arg: str) -> str:
    path = pathlib.Path(arg)
    return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else arg


def store(
    key: str,
    value,
    seeds,
    wall_seconds: float | None = None,
    kept_from: dict | None = None,
    command: str | None = None,
) -> dict:
    """``value`` as section ``key`` of benchmarks/results.json (see `save`), then BENCHMARKS.md rewritten."""
    results = save(RESULTS, key, value, seeds, wall_seconds, kept_from, command)
    write(results)
    return results


def save(
    path: pathlib.Path,
    key: str,
    value,
    seeds,
    wall_seconds: float | None = None,
    kept_from: dict | None = None,
    command: str | None = None,
) -> dict:
    """``value`` as section ``key`` of the results file ``path``, with its ``provenance`` (``seeds``: the seeds it
    ran, None where nothing is drawn at random). ``kept_from``: an earlier section whose provenance stands (a
    replay that re-reads a stored run's logs, not a new measurement). Returns the whole file's results."""
    results = read(path)
    stamp = provenance(seeds, wall_seconds, command)
    stamp.update({k: kept_from[k] for k in PROVENANCE if k in (kept_from or {})})
    results[key] = {**value, **stamp}
    if key in HEADLINE_SECTIONS:
        results.update({k: value[k] for k in HEADLINE if k in value})
    text = json.dumps(results, indent=2, sort_keys=True) + "\n"
    path.write_text(text)
    return json.loads(text)  # as the file holds it (keys sorted): a report rendered now reads as one rendered later


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


def with_note(lines: list[str], r: dict) -> list[str]:
    """A section's lines, then its stored ``note`` (what else ran on the machine) in parentheses, then a blank line."""
    return lines + (["", f"({r['note']}.)"] if r.get("note") else []) + [""]


def table_section(
    title: str, command: str, r: dict, intro: str, header: list[str], rows: list[list[str]]
) -> list[str]:
    """A measured section as a heading with its command and stamp, a paragraph, one table and the stored note."""
    lines = [f"## {title} (`{command}`, {stamp(r)})", "", intro, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return with_note(lines + ["| " + " | ".join(row) + " |" for row in rows], r)


def _times(values: list[float], digits: int = 2) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def checkpointing_lines(r: dict) -> list[str]:
    """`utilisation.py checkpointing`: the training step with activation checkpointing on and off, side by side."""
    rows = [
        [
            name,
            f"{x['rows']} x {x['length']} tokens",
            _times(x["on"], 3),
            _times(x["off"], 3),
            f"x{_mfu(x['off_speedup'])}",
        ]
        for name, x in r["per_model"].items()
    ]
    return table_section(
        "Activation checkpointing",
        "python benchmarks/utilisation.py checkpointing",
        r,
        "Forward + backward of one micro-batch with activation checkpointing on (TRL's configs turn it on by "
        "default; every layer's forward runs again in the backward pass) and off, side by side in each repeat; "
        "same gradients. The CPU demo recipes turn it off (`gradient_checkpointing: false`); a model whose "
        "activations do not fit keeps it on.",
        ["model", "micro-batch", "seconds on", "seconds off", "off: speedup, median (min-max)"],
        rows,
    )


def padding_lines(r: dict) -> list[str]:
    """`utilisation.py padding`: a generation batch's micro-batches as TRL pads them and cut to their own width."""
    rows = [
        [
            name,
            kind,
            f"{x['rows']}, {x['micro']}",
            f"{x['prompt']}, {x['lengths'][0]}-{x['lengths'][1]}",
            f"{x['padded_columns']} -> {x['cut_columns']}",
            _times(x["uncut"]),
            _times(x["cut"]),
            f"x{_mfu(x['cut_speedup'])}",
        ]
        for name, per_kind in r["per_model"].items()
        for kind, x in per_kind.items()
    ]
    return table_section(
        "Micro-batches at their own width",
        "python benchmarks/utilisation.py padding",
        r,
        "TRL pads every micro-batch of a generation batch to the batch's longest completion; "
        "`MultiTurnStarPOTrainer.compute_loss` cuts the columns that are padding in every row of its micro-batch "
        "(same loss and gradients to float rounding, tested). Forward + backward of every micro-batch of one "
        "generation batch (shuffled, then split, as TRL does) both ways, side by side in each repeat. Completion "
        "lengths drawn uniformly between the bounds shown, not measured rollouts.",
        ["model", "batch", "rows, micro-batch rows", "prompt, completion tokens", "completion columns: padded -> cut",
         "seconds padded", "seconds cut", "cut: speedup, median (min-max)"],
        rows,
    )  # fmt: skip


def finished_rows_lines(r: dict) -> list[str]:
    """`utilisation.py finished`: a rollout with finished rows carried to the end of each call and dropped."""
    rows = []
    for name, x in r["per_model"].items():
        share, steps = x["finished_row_share"], x["row_steps"]
        rows.append(
            [
                name,
                str(x["episodes"]),
                f"{share['carried']['median']:.3f} -> {share['dropped']['median']:.3f}",
                f"{statistics.median(steps['carried']):.0f} -> {statistics.median(steps['dropped']):.0f}",
                _times(x["carried"]),
                _times(x["dropped"]),
                f"x{_mfu(x['dropped_speedup'])}",
            ]
        )
    return table_section(
        "Finished rows leave the batch",
        "python benchmarks/utilisation.py finished",
        r,
        "`model.generate` keeps computing a row whose reply has ended until the call's last reply ends; `HFBackend` "
        "ends a call once a quarter of its rows are done (8 or more tokens of the limit left) and goes on with the "
        "others from their kept cache (`drop_finished_rows`, on by default with KV reuse; tokens drawn from the same "
        "softmax, tested). The same FrozenLake rollout (3 turns, replies stopped at `</answer>` or 48 tokens, "
        "temperature 1, same seed) both ways, side by side in each repeat.",
        ["model", "episodes", "finished-row share: carried -> dropped", "rows x steps: carried -> dropped",
         "seconds carried", "seconds dropped", "dropped: speedup, median (min-max)"],
        rows,
    )  # fmt: skip


def decode_split_lines(r: dict) -> list[str]:
    """`utilisation.py decode`: where a decode step's time goes, by rows and cached history length."""
    rows = [
        [
            name,
            str(x["batch"]),
            history,
            f"{s['step_seconds']:.3f}",
            f"{s['linear_share']:.2f}",
            f"{s['history_share']:.2f}",
            f"{s['sampling_share']:.2f}",
            f"{s['rest_share']:.2f}",
        ]
        for name, per_batch in r["per_model"].items()
        for x in per_batch
        for history, s in sorted(x["split"].items(), key=lambda item: int(item[0]))
    ]
    return table_section(
        "Where a decode step's time goes",
        "python benchmarks/utilisation.py decode",
        r,
        "HF backend decode steps continuing rows whose history is in the kept cache, median of 3 repeats. Each "
        "step's time is fitted as a line in the cached history (least squares over the lengths shown): the slope "
        "is attention over the history (reading its keys and values). The linear layers' share is their time at "
        "the matmul rate this machine reaches for that many rows; sampling (the log-softmax the logprobs are read "
        "from, softmax and the draw over the vocabulary) is timed alone; the rest is norms, rotary embeddings, the "
        "mask and cache bookkeeping and the Python of each step. Each part is measured on its own, so the shares "
        "carry the machine's noise: a negative rest (or slope) is zero within it.",
        ["model", "rows", "cached tokens", "step seconds", "linear layers", "attention over the history", "sampling",
         "rest"],
        rows,
    )  # fmt: skip


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


# -- README: its result tables, rendered from results.json ------------------------------------------------------------
README = ROOT / "README.md"


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


def spread_text(section: dict, key: str) -> str:
    """A ratio as its median and (min-max, repeats) when the section stored its repeats (``<key>_repeats``)."""
    reps = section.get(f"{key}_repeats")
    if not reps:
        return f"{section[key]:.2f}"
    return f"{section[key]:.2f} ({min(reps):.2f}-{max(reps):.2f}, {len(reps)} repeats)"


README_TABLES = {"demo": demo_table}


def block_markers(name: str) -> tuple[str, str]:
    """The comments that open and close a rendered block ``NAME`` in README.md or BENCHMARKS.md."""
    return f"<!-- results:{name} -->", f"<!-- /results:{name} -->"


def render_readme(text: str, results: dict, tables: dict | None = None) -> str:
    """``text`` (README.md) with each ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->`` block of ``tables``
    (name -> renderer; default: this file's, ``README_TABLES``) rendered from ``results``."""
    for name, render in (README_TABLES if tables is None else tables).items():
        start, end = block_markers(name)
        if start not in text:
            continue
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + start + "\n" + "\n".join(render(results)) + "\n" + end + tail
    return text


REAL_MODEL_BLOCK = "real-model"  # BENCHMARKS.md's block that experiments/report.py writes (the real model's learning)


def kept_block(name: str) -> list[str]:
    """BENCHMARKS.md's ``<!-- results:NAME -->`` block as the file holds it now: another report writes it
    (experiments/report.py, from experiments/results.json, as it writes README's real-model table) and these
    scripts keep it as it is."""
    start, end = block_markers(name)
    text = MARKDOWN.read_text() if MARKDOWN.exists() else ""
    inner = text.split(start, 1)[1].split(end, 1)[0].strip("\n") if start in text else ""
    return [start, *inner.splitlines(), end, ""]


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
    one("vllm_cpu", vllm_cpu_lines),
    one("utilisation", utilisation_lines),
    one("activation_checkpointing", checkpointing_lines),
    one("micro_batch_padding", padding_lines),
    one("finished_rows", finished_rows_lines),
    one("decode_split", decode_split_lines),
    one("critic_memory", critic_memory_lines),
    gpu_check_lines,
)


def render_sections(head: list[str], sections, results: dict) -> str:
    """A report's text: its ``head`` lines, then each renderer's lines for ``results``, prose wrapped."""
    lines = list(head)
    for section in sections:
        lines += section(results)
    return "\n".join(wrapped(lines))


def render(results: dict) -> str:
    """BENCHMARKS.md's text for ``results``; the real model's block kept as the file holds it (``kept_block``)."""
    head = [
        "# Benchmarks",
        "",
        "Written by the scripts in `benchmarks/` from `benchmarks/results.json`; do not edit by hand. The studies "
        "(learning, the algorithm comparisons: GiGPO against GRPO and a critic, the refill, overlong turns; "
        "collapse; the real model) are in [experiments/](experiments/README.md); their real-model results are "
        "summed up below.",
        "",
    ]
    demo, *rest = SECTIONS  # the real model's learning after the CPU demo's
    return render_sections(head, [demo, lambda _: kept_block(REAL_MODEL_BLOCK), *rest], results)


def write(results: dict) -> None:
    """BENCHMARKS.md and README's result tables from ``results``."""
    MARKDOWN.write_text(render(results))
    README.write_text(render_readme(README.read_text(), results))
