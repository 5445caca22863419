"""The collapse guard on a real CPU run: a recipe pushed into collapse vs the StarPO-S recipe.

    python -m experiments.collapse        # about 40 minutes on 2 CPU cores (make bench-collapse)
    python -m experiments.collapse --real [NAME] # SmolLM2-135M-Instruct, plain GRPO (REAL_RUNS; 70-90 minutes)
    python -m experiments.collapse --start-mi    # the MI of its two warm starts before RL (about 25 minutes)

Both runs start from the same warm-started tiny model on non-slippery FrozenLake (the CPU demo),
with `collapse_guard=warn` and its default thresholds, side by side in two processes:

- collapse: plain GRPO (no variance filter, keep ratio 1.0), no entropy bonus, and a learning rate
  ramped from 0 to 3e-3 over the first half of the run (10x the demo's), then held;
- StarPO-S: the demo recipe (keep the most uncertain half of the groups, LR 3e-4).

Reported: the guard's events, "early success" (mean train success over the first 10 rollouts)
and the first step where the 5-rollout moving average of train success falls below half of it.
The events are those of the guard's rules with the shipped defaults run over each logged history
(in `warn` mode the guard does not change training, so this is what the live guard logs), so
`python -m experiments.collapse --replay` re-judges saved runs after a change of the rules without
training again. Each run's dashboard (success, reward std, entropy, grad norm, diversity, guard
events) is saved beside the results as experiments/figures/collapse-<run>.png.

`--real` asks the same question of a real model, where the reasoning reads its input (the tiny
model's reasoning is template words, so its MI metrics sit at chance): SmolLM2-135M-Instruct after
the warm start of `recipes/smollm2-cpu-frozenlake.yaml` (SFT on a noisy expert, its noise lowered to
0.1 for a higher starting success; built once in runs/bench-collapse/real-warm) is trained with that
recipe's rollouts on 8 lakes x 4 episodes a step, but plain GRPO (no filter, no entropy bonus), a
ramped learning rate (REAL_RUNS: `real-collapse`, the default, 2x the recipe's over 12 steps;
`real-5x`, 5x over 20 steps; `real-5x-state`, that for 40 steps from the warm start whose expert
thinks describe the state), and the MI pass every 2 steps on a uniformly drawn turn of two episodes
per lake (8 lakes, 16 reasonings; all four in `real-5x-state`, 32). Each run has its own results
section; it stops cleanly after 85 minutes (`real-5x-state`: 120) if its steps are not done.
`--start-mi` measures the MI of the two warm starts before any RL. experiments/collapse.md reads the runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

from transformers import TrainerCallback

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

from experiments import report as _report  # noqa: E402,F401  (records the code's commit as the run starts)

OUT = ROOT / "runs" / "bench-collapse"
STEPS = 120
RUNS = {
    "collapse": dict(
        rollout_filter_ratio=1.0,
        entropy_coef=0.0,
        learning_rate=3e-3,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=STEPS // 2,
    ),
    "starpo-s": dict(),  # the demo recipe as it is
}
RECIPE = "demo-cpu-frozenlake.yaml"
REAL_BUDGET_S = 85 * 60  # a run stops cleanly (its report written) after this long: a session is 3 hours
REAL_BUDGET_S_LONG = {"real-5x-state": 120 * 60}  # runs that need most of a session (nothing heavy beside them)
REAL_RECIPE = "smollm2-cpu-frozenlake.yaml"
REAL_WARM = OUT / "real-warm"  # that recipe's warm start (SFT on a noisy expert), with the expert's noise at 0.1
REAL_WARM_NOISE = 0.1
REAL_WARM_STATE = OUT / "real-warm-state"  # the same warm start with warm_start_think: state
REAL_COMMON = dict(
    num_start_states=8,  # 8 lakes x 4 rollouts (the recipe: 4 x 8): twice the inputs per MI pass
    num_generations=4,
    rollout_filter_ratio=1.0,
    entropy_coef=0.0,
    lr_scheduler_type="constant_with_warmup",
    mi_metrics_every=2,
    mi_metrics_turn="uniform",  # the first turn starts on the same square in every lake: later turns differ
    mi_metrics_inputs=8,
    mi_metrics_per_input=2,
)
# run name -> (results.json section, warm start's think, settings). 10x the recipe's learning rate (2e-4 over a
# 12-step ramp) crashed this start by step 6, inside every rule's 10-log warm-up; 2x did not crash in 24 steps;
# 5x ramps over 20 steps so that it passes 2x only after the warm-up. real-5x-state: the same from the warm
# start whose expert thinks describe the state (warm_start_think: state), where the reasoning carries more
# of its input for MI to lose; it runs 40 steps (real-5x fell only from step 22 of 30) and scores all four
# episodes of each lake in the MI pass (32 reasonings: the shared-prefix pass makes that cheap).
FIVE_X = dict(REAL_COMMON, max_steps=30, learning_rate=1e-4, warmup_steps=20)
REAL_RUNS = {
    "real-collapse": ("collapse_real", "action", dict(REAL_COMMON, max_steps=24, learning_rate=4e-5, warmup_steps=12)),
    "real-5x": ("collapse_real_5x", "action", FIVE_X),
    "real-5x-state": ("collapse_real_5x_state", "state", dict(FIVE_X, max_steps=40, mi_metrics_per_input=4)),
}
WARM_DIRS = {"action": REAL_WARM, "state": REAL_WARM_STATE}


def warm_model() -> pathlib.Path:
    """The warm-started FrozenLake model of the CPU demo recipe (built once, reused)."""
    from experiments.learning import warm_started

    return warm_started(RECIPE, OUT / "warm")


def worker(
    name: str,
    recipe: str = RECIPE,
    model_dir: pathlib.Path = OUT / "warm",
    settings: dict | None = None,
    budget_s: float | None = None,
) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments.learning import parse
    from starpo_trl import MultiTurnStarPOTrainer

    out = OUT / name
    settings = {"max_steps": STEPS, **(RUNS[name] if settings is None else settings)}
    _, args, _, _ = parse(recipe, output_dir=str(out), collapse_guard="warn", disable_tqdm=True, **settings)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = MultiTurnStarPOTrainer(model, args, processing_class=AutoTokenizer.from_pretrained(model_dir))
    start = time.time()
    if budget_s is not None:
        trainer.add_callback(StopAfter(budget_s, start))
    trainer.train()
    with open(out / "report.json", "w") as f:
        json.dump(
            {
                "env_id": args.env_id,
                "log_history": trainer.state.log_history,
                "guard_events": trainer.guard.events,
                "wall_seconds": round(time.time() - start, 1),
            },
            f,
        )


class StopAfter(TrainerCallback):
    """Ends training at the first step end past ``budget_s`` seconds from ``start``
    (the run's report is still written, with the steps it made)."""

    def __init__(self, budget_s: float, start: float):
        self.budget_s, self.start = budget_s, start

    def on_step_end(self, args, state, control, **kwargs):
        if time.time() - self.start > self.budget_s:
            control.should_training_stop = True
        return control


def halved_step(history: list[dict], key: str, early_n: int = 10, window: int = 5) -> tuple[float, int | None]:
    """(early success, first step whose moving average is below half of it, or None)."""
    rows = [(r["step"], r[key]) for r in history if key in r]
    early = sum(v for _, v in rows[:early_n]) / max(1, len(rows[:early_n]))
    for i in range(early_n, len(rows)):
        avg = sum(v for _, v in rows[i - window + 1 : i + 1]) / window
        if avg < 0.5 * early:
            return early, rows[i][0]
    return early, None


def raw_crossings(history: list[dict], env_name: str) -> dict[str, dict]:
    """When each indicator's raw (unsmoothed) value first fell below its rule's threshold: the guard's own
    rules, unsmoothed (``smoothing=1``) and without patience, so each fires at its first raw value below.
    I(X;Z) has no rule of its own; it is judged as retrieval is. The live rules smooth these series and wait
    ``patience`` logs, so this is the earliest they could warn."""
    import dataclasses

    from starpo_trl.monitoring import keys
    from starpo_trl.monitoring.guard import CollapseMonitor, signals_from_logs

    rules = dataclasses.replace(shipped_rules(), collapse_guard_smoothing=1.0, collapse_guard_patience=1)
    signals, mi = CollapseMonitor(rules), CollapseMonitor(rules)  # mi: I(X;Z) in the retrieval rule's place
    first = {}
    for row in history:
        if "loss" in row or "grad_norm" in row:
            for name in signals.update(row["step"], signals_from_logs(row, env_name)):
                first[name] = row["step"]
            if keys.MI_ESTIMATE in row and mi.update(row["step"], {"retrieval": row[keys.MI_ESTIMATE]}):
                first["mi_estimate"] = row["step"]
    out = {}
    for name, monitor, rule in (
        ("reward_std", signals, "reward_std"),
        ("entropy", signals, "entropy"),
        ("retrieval", signals, "retrieval"),
        ("mi_estimate", mi, "retrieval"),
    ):
        early, threshold = monitor.early_level(rule), monitor.threshold(rule)
        if early is not None and threshold is not None:
            out[name] = {"early": round(early, 4), "threshold": round(threshold, 4), "first_step": first.get(name)}
    return out


def shipped_rules():
    """The guard's rules as the recipes ship them (the runs log in `warn` mode: the rules are re-judged here)."""
    from experiments.learning import parse
    from starpo_trl.monitoring.settings import GuardSettings

    return GuardSettings.of(parse(RECIPE)[1])


def guard_events(history: list[dict], env_name: str) -> list[dict]:
    """The guard's events with the shipped default rules, over a logged history (as the live guard in warn mode)."""
    from starpo_trl.monitoring.guard import CollapseMonitor, signals_from_logs

    monitor, events = CollapseMonitor(shipped_rules()), []
    for row in history:
        if "loss" in row or "grad_norm" in row:
            fired = monitor.update(row["step"], signals_from_logs(row, env_name))
            if fired:
                events.append({"step": row["step"], "rules": fired})
    return events


def main(replay: bool = False) -> None:
    from experiments.report import store

    if not replay:
        warm_model()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = {name: subprocess.Popen([sys.executable, __file__, "--worker", name], env=env) for name in RUNS}
        for name, proc in procs.items():
            if proc.wait() != 0:
                raise SystemExit(f"run {name} failed")
    results = {name: summarise(name, RUNS[name] or "demo recipe") for name in RUNS}
    c, s = results["collapse"], results["starpo-s"]
    store(
        "collapse",
        {
            "runs": results,
            "steps": STEPS,
            "guard_fired_in_collapse_run": c["guard_first_step"] is not None,
            "guard_before_success_halved": c["guard_first_step"] is not None
            and (c["success_halved_step"] is None or c["guard_first_step"] < c["success_halved_step"]),
            "success_halved_in_collapse_run": c["success_halved_step"] is not None,
            "guard_silent_in_starpo_s_run": s["guard_first_step"] is None,
            "success_crash_step": next(
                (
                    st
                    for st, v in crash_rows(json.loads((OUT / "collapse" / "report.json").read_text())["log_history"])
                    if v == 0.0
                ),
                None,
            ),
        },
        seeds=[0],
    )


def summarise(name: str, settings, every: int | None = None) -> dict:
    """One run's results: the guard's events, early success and when it halved, the MI summary, its dashboard."""
    from starpo_trl.monitoring.plotting import plot_dashboard

    report = json.loads((OUT / name / "report.json").read_text())
    history = [{k: v for k, v in row.items() if not k.startswith("guard/")} for row in report["log_history"]]
    events = guard_events(history, "FrozenLake-v0")
    early, halved = halved_step(history, "env/FrozenLake-v0/success")
    png = HERE / "figures" / f"collapse-{name}.png"
    png.parent.mkdir(exist_ok=True)
    plot_dashboard(history, str(png), "FrozenLake-v0", events, title=f"{name}: FrozenLake-v0, collapse_guard=warn")
    first = events[0] if events else None
    result = {
        "settings": settings,
        "guard_first_step": first["step"] if first else None,
        "guard_rules": [e["rules"] for e in events],
        "guard_steps": [e["step"] for e in events],
        "early_success": round(early, 4),
        "success_halved_step": halved,
        "retrieval_first_step": next((e["step"] for e in events if "retrieval" in e["rules"]), None),
        "raw_crossings": raw_crossings(history, "FrozenLake-v0"),
        "mi_overhead": mi_overhead(history, every),
        **mi_summary(history),
        "wall_seconds": report["wall_seconds"],
        "png": str(png.relative_to(ROOT)),
    }
    print(name, result, flush=True)
    return result


def real(name: str = "real-collapse", replay: bool = False) -> None:
    """SmolLM2-135M-Instruct after its FrozenLake recipe, pushed toward collapse with the MI pass every 2 steps."""
    from experiments.report import load, store

    section, think, settings = REAL_RUNS[name]
    if not replay:
        from experiments.learning import warm_started

        warm = warm_started(REAL_RECIPE, WARM_DIRS[think], warm_start_noise=REAL_WARM_NOISE, warm_start_think=think)
        worker(name, REAL_RECIPE, warm, settings, budget_s=REAL_BUDGET_S_LONG.get(name, REAL_BUDGET_S))
    result = summarise(name, settings, every=settings["mi_metrics_every"])
    history = json.loads((OUT / name / "report.json").read_text())["log_history"]
    mi_rows = [r for r in history if "collapse/retrieval_accuracy" in r]
    store(
        section,
        {
            "model": f"SmolLM2-135M-Instruct (the warm start of recipes/{REAL_RECIPE}, expert noise {REAL_WARM_NOISE}"
            + (", the expert's think describing the state first" if think == "state" else "")
            + ")",
            "steps": sum(1 for r in history if "loss" in r),  # fewer than planned for a run stopped early
            "planned_steps": settings["max_steps"],
            "run": result,
            "per_step": [  # what the docs read the run by (runs/ is not kept)
                {
                    k: r[k]
                    for k in (
                        "step",
                        "env/FrozenLake-v0/success",
                        "env/FrozenLake-v0/group_reward_std_mean",
                        "env/FrozenLake-v0/format_error_rate",
                        "entropy",
                        "reasoning/think_words",
                        "reasoning/template_share",
                    )
                    if k in r
                }
                for r in history
                if "loss" in r
            ],
            "mi_passes": [
                {
                    k: r.get(k)
                    for k in (
                        "step",
                        "collapse/retrieval_accuracy",
                        "collapse/retrieval_chance",
                        "collapse/mi_estimate",
                        "collapse/mi_estimate_per_token",
                        "collapse/mi_zscore",
                        "collapse/own_input_zscore",
                    )
                }
                for r in mi_rows
            ],
        },
        seeds=[0],
        command="python -m experiments.collapse --real" + ("" if name == "real-collapse" else f" {name}"),
        kept_from=load().get(section) if replay else None,  # a replay re-judges the logged run
    )


def start_mi(lakes: int = 8, per_lake: int = 4, rollouts: int = 2) -> None:
    """How much the reasoning carries its input before any RL, for the two warm starts of the real model:
    the expert's think naming only the action (``warm_start_think: action``, the collapse runs' start) or
    saying what it reads off the state first (``state``). Each plays the same ``rollouts`` x ``lakes`` lakes x
    ``per_lake`` episodes (sampled as in training) and takes the MI pass of the collapse runs on each
    (a uniformly drawn turn of every episode). Stored as the "mi_warm_starts" section."""
    import statistics

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments.learning import parse, warm_started
    from experiments.report import store
    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.rollout import StartState

    rows = {}
    for think, warm_dir in WARM_DIRS.items():
        warm = warm_started(REAL_RECIPE, warm_dir, warm_start_noise=REAL_WARM_NOISE, warm_start_think=think)
        settings = dict(REAL_COMMON, num_start_states=lakes, num_generations=per_lake, mi_metrics_inputs=lakes)
        settings["mi_metrics_per_input"] = per_lake
        _, args, _, _ = parse(REAL_RECIPE, output_dir=str(OUT / f"start-mi-{think}"), disable_tqdm=True, **settings)
        tok = AutoTokenizer.from_pretrained(warm)
        model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
        trainer = MultiTurnStarPOTrainer(model, args, processing_class=tok)
        env = args.train_envs()[0]
        kwargs = tuple(sorted(env.env_kwargs.items()))
        passes, success = [], []
        for r in range(rollouts):
            seeds = range(args.train_seed_offset + r * lakes, args.train_seed_offset + (r + 1) * lakes)
            starts = [StartState(env.env_id, seed, kwargs) for seed in seeds for _ in range(per_lake)]
            torch.manual_seed(r)
            rollout = trainer.play(starts, trainer.temperature)
            success.append(statistics.mean(float(ep.success) for ep in rollout))
            passes.append(trainer.step_log.mutual_information(model, rollout, tok, trainer.temperature, step=r))
            print(think, r, success[-1], {k: round(v, 3) for k, v in passes[-1].items()}, flush=True)
        think_text = next(
            (m["content"] for ep in rollout for m in ep.messages if m["role"] == "assistant"), ""
        )  # one reply, to show
        rows[think] = {
            "success": round(statistics.mean(success), 4),
            "example_reply": think_text,
            **{
                key: round(statistics.mean(p[f"collapse/{key}"] for p in passes), 4)
                for key in ("mi_estimate", "retrieval_accuracy", "retrieval_chance", "num_inputs", "num_reasonings")
            },
            "mi_per_pass": [round(p["collapse/mi_estimate"], 4) for p in passes],
            "mi_seconds": round(statistics.mean(p["collapse/mi_seconds"] for p in passes), 1),
        }
    store(
        "mi_warm_starts",
        {"lakes": lakes, "per_lake": per_lake, "rollouts": rollouts, "noise": REAL_WARM_NOISE, "by_think": rows},
        seeds=range(rollouts),
    )


def mi_summary(history: list[dict]) -> dict:
    """How much the reasoning depended on the input over the run: the MI passes' mean retrieval
    accuracy, its chance level and the mean I(X;Z) estimate."""
    rows = [r for r in history if "collapse/retrieval_accuracy" in r]
    if not rows:
        return {"mi_passes": 0}

    def mean(key):
        return round(sum(r[key] for r in rows) / len(rows), 4)

    return {
        "mi_passes": len(rows),
        "mi_retrieval_mean": mean("collapse/retrieval_accuracy"),
        "mi_chance_mean": mean("collapse/retrieval_chance"),
        "mi_estimate_mean": mean("collapse/mi_estimate"),
    }


def mi_overhead(history: list[dict], every: int | None = None) -> float | None:
    """The MI pass's share of training time: its mean seconds, once per ``every`` steps (default: the demo
    recipe's ``mi_metrics_every``), over the mean step time (None when the run logged no MI pass)."""
    from experiments.learning import parse

    mi = [r["collapse/mi_seconds"] for r in history if "collapse/mi_seconds" in r]
    steps = [r["step_time"] for r in history if "step_time" in r]
    if not mi or not steps:
        return None
    every = every or parse(RECIPE)[1].mi_metrics_every
    return round(sum(mi) / len(mi) / every / (sum(steps) / len(steps)), 4)


def crash_rows(history: list[dict]) -> list[tuple[int, float]]:
    return [
        (r["step"], r["env/FrozenLake-v0/success"])
        for r in history
        if "env/FrozenLake-v0/success" in r and r["step"] > 10
    ]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    elif "--start-mi" in sys.argv:
        start_mi()
    elif "--real" in sys.argv:
        names = [a for a in sys.argv[1:] if not a.startswith("--")]
        real(*(names or ["real-collapse"]), replay="--replay" in sys.argv)
    else:
        main(replay="--replay" in sys.argv)
