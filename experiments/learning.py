"""The paper's finding 4 at small scale: variance-filter keep ratio 1.0 vs 0.5 vs 0.25; and RAGEN's
current filter against the paper's and against none.

    python -m experiments.learning             # both parts (make bench-learning)
    python -m experiments.learning ratios      # about 30 minutes on 2 CPU cores
    python -m experiments.learning strategies  # about 25 minutes per env on 2 CPU cores
    python -m experiments.learning windows     # about 25 minutes per env on 2 CPU cores
    python -m experiments.learning strategies windows --env starpo/Sokoban-v0   # one env; others' results kept

For Bandit and FrozenLake (the CPU demo recipes): one warm start, then for each keep ratio and
seed 0, 1, 2 a StarPO run from that same warm-started model; reports final held-out success,
the step where training collapsed (if any) and wall time, draws one PNG per env, and says whether
the paper's ordering held. Collapse: the 5-step moving average of training success falls below
half of its best value so far (after step 10).

``strategies``: on FrozenLake and Sokoban (``--env`` for one), from each env's warm start, seeds 0, 1, 2 of: the paper's top-k 0.25 by
std, RAGEN's current recommendation (reward variance, linear top-p 0.9, zero-variance groups
dropped) and no filter; final held-out success, mean kept share of the episodes, steps the
filter emptied, wall time; into results.json "filter_strategies" and experiments/README.md.

``credit``, ``refill``, ``overlong`` (the turn-level credit, refill and overlong comparisons): on FrozenLake and
Sokoban (``--env`` for one), from each env's warm start, seeds 0, 1, 2 of each variant in ``COMPARISONS``
(GRPO / GiGPO / bi-level GAE; RAGEN's filter without and with the refill; overlong keep / mask / penalty on
19-token replies): final held-out success, wall time, tokens trained per step, generated episodes per
trained episode, share of cut turns; into results.json "credit_assignment", "refill", "overlong" and
experiments/README.md. About 25 minutes per env and part on 2 CPU cores alone (the critic's runs take longer).

``windows``: on FrozenLake and Sokoban (``--env`` for one), from each env's warm start (trained on whole histories), seeds 0, 1, 2 of
``context_window`` full, window:1 and single_turn (training and held-out evaluation alike): final
held-out success, mean tokens of the training rows per step, wall time; into results.json
"context_windows" and experiments/README.md.
"""

from __future__ import annotations

import pathlib
import time
import warnings

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

from experiments import report  # noqa: E402,F401  (records the code's commit as the run starts)

warnings.filterwarnings("ignore")

RATIOS = (1.0, 0.5, 0.25)
STRATEGIES = {
    "top_k 0.25 (paper)": {"rollout_filter_strategy": "top_k", "rollout_filter_ratio": 0.25},
    "top_p linear 0.9, no zero groups (RAGEN now)": {
        "rollout_filter_strategy": "top_p",
        "rollout_filter_ratio": 0.9,
        "rollout_filter_metric": "reward_variance",
        "rollout_filter_top_p_mode": "linear",
        "rollout_filter_include_zero": False,
    },
    "no filter": {"rollout_filter_strategy": "top_k", "rollout_filter_ratio": 1.0},
}
STRATEGY_ENVS = ("starpo/FrozenLake-v0", "starpo/Sokoban-v0")
WINDOWS = ("full", "window:1", "single_turn")
SEEDS = (0, 1, 2)
RECIPES = {
    "starpo/Bandit-v0": ("demo-cpu-bandit.yaml", 10),
    "starpo/FrozenLake-v0": ("demo-cpu-frozenlake.yaml", 60),
    "starpo/Sokoban-v0": ("demo-cpu-sokoban.yaml", 60),
}
OUT = ROOT / "runs" / "bench-learning"


def parse(recipe: str, **overrides):
    import yaml

    import train

    config = {**yaml.safe_load((ROOT / "recipes" / recipe).read_text()), **overrides}
    return train.parser().parse_dict(config)


def collapse_step(log_history, key) -> int | None:
    rows = [(r["step"], r[key]) for r in log_history if key in r]
    best, window = 0.0, []
    for step, value in rows:
        window = (window + [value])[-5:]
        avg = sum(window) / len(window)
        if step > 10 and best > 0 and avg < 0.5 * best:
            return step
        best = max(best, avg)
    return None


def warm_started(recipe: str, warm_dir: pathlib.Path, **overrides) -> pathlib.Path:
    """The recipe's warm-started model (``overrides`` over the recipe), made once and saved in ``warm_dir``."""
    from starpo_trl.models import load_model_and_tokenizer
    from starpo_trl.warm_start import warm_start_from_config

    if not (warm_dir / "model.safetensors").exists():
        run_args, args, model_args, tiny_args = parse(recipe, output_dir=str(warm_dir), **overrides)
        model, tok = load_model_and_tokenizer(model_args, tiny_args, seed=0)
        model = warm_start_from_config(model, tok, run_args, args, str(warm_dir / "sft"))
        model.save_pretrained(warm_dir)
        tok.save_pretrained(warm_dir)
    return warm_dir


def run_from(warm_dir: pathlib.Path, args):
    """A StarPO run from the warm-started model; returns the trainer (trained) and its final held-out metrics. A
    run that one of the trainer's stop rules ends (nothing to train on, the filter keeping nothing) is evaluated
    as it stands, its metrics' ``stopped`` holding the rule's message, so one variant does not end a comparison."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.monitoring.empty_steps import TrainingStopped

    tok = AutoTokenizer.from_pretrained(warm_dir)
    trainer = MultiTurnStarPOTrainer(AutoModelForCausalLM.from_pretrained(warm_dir), args, processing_class=tok)
    try:
        trainer.train()
    except TrainingStopped as stop:  # any other error is a failure, raised as it is
        return trainer, {**trainer.evaluate_success(), "stopped": f"step {trainer.state.global_step}: {stop}"}
    return trainer, trainer.evaluate_success()


def variant_runs(env_id: str, variants: dict[str, dict], tag: str = ""):
    """For each variant (label -> settings over the recipe) and seed: a StarPO run from the env's cached
    warm start; yields ``(label, seed, log_history, final held-out metrics, wall seconds)``."""
    from envs.contract import env_name

    recipe, max_steps = RECIPES[env_id]
    name = env_name(env_id)
    warm_dir = warm_started(recipe, OUT / name / "warm")
    for k, (label, settings) in enumerate(variants.items()):
        for seed in SEEDS:
            out = OUT / name / f"{tag or settings.get('context_window', 'full').replace(':', '')}-variant{k}-s{seed}"
            _, args, _, _ = parse(recipe, output_dir=str(out), seed=seed, max_steps=max_steps, **settings)
            start = time.time()
            trainer, final = run_from(warm_dir, args)
            yield label, seed, trainer.state.log_history, final, round(time.time() - start, 1)


def strategies() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import statistics

    import matplotlib.pyplot as plt

    from envs.contract import env_name
    from experiments.report import store
    from starpo_trl.monitoring.plotting import series

    results = {}
    for env_id in ENVS:
        name = env_name(env_id)
        runs = []
        fig, ax = plt.subplots(figsize=(6, 4))
        colors = dict(zip(STRATEGIES, ("tab:green", "tab:blue", "tab:red")))
        for label, seed, history, final, wall in variant_runs(env_id, STRATEGIES):
            kept = [r["rollout/kept_fraction"] for r in history if "rollout/kept_fraction" in r]
            runs.append(
                {
                    "strategy": label,
                    "seed": seed,
                    "final_success": final["success"],
                    "kept_fraction_mean": round(statistics.mean(kept), 4) if kept else None,
                    "empty_after_filter_steps": int(sum(r.get("rollout/empty_after_filter", 0) > 0 for r in history)),
                    "wall_seconds": wall,
                }
            )
            steps, values = series(history, f"env/{name}/success")
            ax.plot(steps, values, color=colors[label], alpha=0.6, label=label if seed == SEEDS[0] else None)
            print(name, runs[-1], flush=True)
        ax.set_title(f"{env_id}: train success by rollout filter (3 seeds)")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        fig.tight_layout()
        png = HERE / "figures" / f"filter-strategies-{name}.png"
        png.parent.mkdir(exist_ok=True)
        fig.savefig(png, dpi=100)
        plt.close(fig)
        summary = {}
        for label in STRATEGIES:
            finals = [x["final_success"] for x in runs if x["strategy"] == label]
            summary[label] = {"mean": statistics.mean(finals), "spread": max(finals) - min(finals)}
        order = sorted(STRATEGIES, key=lambda k: -summary[k]["mean"])
        results[env_id] = {
            "runs": runs,
            "summary": summary,
            "ordering": order,
            "png": str(png.relative_to(ROOT)),
            **stamp(),
        }
    results = {**kept_results("filter_strategies"), **results}
    store("filter_strategies", {"per_env": results, "strategies": STRATEGIES}, seeds=SEEDS)


def windows() -> None:
    import statistics

    from envs.contract import env_name
    from experiments.report import store

    results = {}
    for env_id in ENVS:
        name = env_name(env_id)
        runs = []
        for window, seed, history, final, wall in variant_runs(env_id, {w: {"context_window": w} for w in WINDOWS}):
            tokens = [r["rollout/tokens_trained"] for r in history if "rollout/tokens_trained" in r]
            runs.append(
                {
                    "window": window,
                    "seed": seed,
                    "final_success": final["success"],
                    "tokens_per_step": round(statistics.mean(tokens), 1) if tokens else None,
                    "wall_seconds": wall,
                }
            )
            print(name, runs[-1], flush=True)
        summary = {
            w: {
                "mean": statistics.mean(x["final_success"] for x in runs if x["window"] == w),
                "spread": max(x["final_success"] for x in runs if x["window"] == w)
                - min(x["final_success"] for x in runs if x["window"] == w),
                "tokens_per_step": statistics.mean(x["tokens_per_step"] for x in runs if x["window"] == w),
            }
            for w in WINDOWS
        }
        results[env_id] = {"runs": runs, "summary": summary, **stamp()}
    results = {**kept_results("context_windows"), **results}
    store("context_windows", {"per_env": results, "windows": list(WINDOWS)}, seeds=SEEDS)


def ratios() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from envs.contract import env_name
    from experiments.report import store
    from starpo_trl.monitoring.plotting import series

    results = {}
    for env_id, (recipe, max_steps) in RECIPES.items():
        name = env_name(env_id)
        warm_dir = warm_started(recipe, OUT / name / "warm")
        runs = []
        fig, ax = plt.subplots(figsize=(6, 4))
        for ratio in RATIOS:
            for seed in SEEDS:
                _, args, _, _ = parse(
                    recipe,
                    output_dir=str(OUT / name / f"r{ratio}-s{seed}"),
                    rollout_filter_ratio=ratio,
                    seed=seed,
                    max_steps=max_steps,
                )
                start = time.time()
                trainer, metrics = run_from(warm_dir, args)
                final = metrics["success"]
                key = f"env/{name}/success"
                runs.append(
                    {
                        "ratio": ratio,
                        "seed": seed,
                        "final_success": final,
                        "collapse_step": collapse_step(trainer.state.log_history, key),
                        "wall_seconds": round(time.time() - start, 1),
                    }
                )
                steps, values = series(trainer.state.log_history, key)
                ax.plot(
                    steps,
                    values,
                    color={1.0: "tab:red", 0.5: "tab:orange", 0.25: "tab:green"}[ratio],
                    alpha=0.6,
                    label=f"keep {ratio}" if seed == 0 else None,
                )
                print(name, runs[-1], flush=True)
        ax.set_title(f"{env_id}: train success by filter keep ratio (3 seeds)")
        ax.set_xlabel("step")
        ax.legend()
        fig.tight_layout()
        png = HERE / "figures" / f"learning-{name}.png"  # committed beside the results
        png.parent.mkdir(exist_ok=True)
        fig.savefig(png, dpi=100)
        plt.close(fig)
        mean = {r: sum(x["final_success"] for x in runs if x["ratio"] == r) / len(SEEDS) for r in RATIOS}
        results[env_id] = {
            "runs": runs,
            "mean_final_success": mean,
            "png": str(png.relative_to(ROOT)),
            "paper_ordering_held": mean[0.25] >= mean[0.5] >= mean[1.0],
        }
    store("learning", {"per_env": results, "ratios": list(RATIOS)}, seeds=SEEDS)


# #47's comparisons, each from the envs' warm starts, same budgets, 3 seeds: label -> settings over the recipe
RAGEN_FILTER = STRATEGIES["top_p linear 0.9, no zero groups (RAGEN now)"]
COMPARISONS = {
    "credit": (
        "credit_assignment",
        {
            "GRPO": {"advantage_estimator": "grpo"},
            "GiGPO (mean_norm, weight 1)": {"advantage_estimator": "gigpo"},
            "bi-level GAE (critic)": {"advantage_estimator": "bilevel_gae"},
        },
    ),
    "refill": (
        "refill",
        {
            "RAGEN filter": RAGEN_FILTER,
            "RAGEN filter + refill (4 rounds)": {**RAGEN_FILTER, "rollout_filter_refill": True},
        },
    ),
    "overlong": (
        "overlong",
        {
            # the demo warm starts' replies run 17-21 tokens (two actions and a think line): 19 cuts 62% of
            # FrozenLake's and 40% of Sokoban's, which a policy can learn to avoid (12 cut 95%, and nothing learned)
            f"{mode}, 19-token replies": {"overlong_turns": mode, "max_tokens_per_turn": 19, "overlong_buffer": 4}
            for mode in ("keep", "mask", "penalty")
        },
    ),
}


QUICK = False  # --max_steps given: a quick check, printed and not stored


def mean_of(history: list[dict], key: str) -> float | None:
    values = [r[key] for r in history if key in r]
    return round(sum(values) / len(values), 4) if values else None


def compare(part: str) -> None:
    """One of ``COMPARISONS`` on ``ENVS``: per variant and seed the final held-out success, wall time, mean
    tokens trained per step, kept share, generated episodes per trained episode and share of cut turns."""
    from experiments.report import store

    section, variants = COMPARISONS[part]
    results = {}
    for env_id in ENVS:
        runs = []
        for label, seed, history, final, wall in variant_runs(env_id, variants, tag=part):
            kept = mean_of(history, "rollout/kept_fraction")
            runs.append(
                {
                    "variant": label,
                    "seed": seed,
                    "final_success": final["success"],
                    "wall_seconds": wall,
                    "tokens_per_step": mean_of(history, "rollout/tokens_trained"),
                    "kept_fraction_mean": kept,
                    "generated_per_trained": round(1 / kept, 3) if kept else None,
                    "cut_turn_fraction": mean_of(history, "rollout/cut_turn_fraction"),
                    "refill_rounds_mean": mean_of(history, "rollout/refill_rounds"),
                    "stopped": final.get("stopped"),
                }
            )
            print(env_id, runs[-1], flush=True)
        results[env_id] = {"runs": runs, **stamp()}
    if QUICK:
        return
    results = {**kept_results(section), **results}
    store(section, {"per_env": results, "variants": variants}, seeds=SEEDS)


def warm_starts() -> None:
    """Each env's cached warm start, the model every comparison starts from, on the held-out episodes the
    comparisons' final evaluation plays (the recipe's ``num_eval_episodes``, ``eval_seed_offset``, ``eval_temperature``):
    the starting point their tables are read against. Beside it, on the same held-out start states and budgets:
    a mover playing uniformly random actions (what luck alone scores) and the warm start's teacher (the noisy
    expert its demonstrations came from)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envs.contract import env_name
    from experiments.report import store
    from starpo_trl import MultiTurnStarPOTrainer

    results = {}
    for env_id in ENVS:
        recipe, _ = RECIPES[env_id]
        name = env_name(env_id)
        warm_dir = warm_started(recipe, OUT / name / "warm")
        run_args, args, _, _ = parse(recipe, output_dir=str(OUT / name / "warm-eval"), seed=0)
        model = AutoModelForCausalLM.from_pretrained(warm_dir)
        trainer = MultiTurnStarPOTrainer(model, args, processing_class=AutoTokenizer.from_pretrained(warm_dir))
        final = trainer.evaluate_success()
        results[env_id] = {
            "success": final["success"],
            "format_error_rate": final.get("format_error_rate"),
            "episodes": args.num_eval_episodes,
            **references(run_args, args, trainer.processing_class, trainer.eos_token_ids),
            **stamp(),
        }
        print(env_id, results[env_id], flush=True)
    if not QUICK:
        store("warm_starts", {"per_env": {**kept_results("warm_starts"), **results}}, seeds=[0])


def references(run_args, args, tokenizer, eos: list[int]) -> dict:
    """What a warm start's held-out success is read against, on the held-out start states of ``args`` with its
    budgets: ``random_mover`` (uniformly random actions) and ``teacher`` (the noisy expert of the warm start's
    demonstrations: ``warm_start_noise``, ``warm_start_actions_per_turn``)."""
    import functools

    from experiments.answers import random_mover_success, text_env
    from starpo_trl.config import rollout_config
    from starpo_trl.warm_start import demonstrations

    env = args.eval_envs()[0]
    seeds = range(args.eval_seed_offset, args.eval_seed_offset + args.num_eval_episodes)
    make = functools.partial(text_env, env)
    budget = (args.max_turns, args.max_actions_per_turn, args.max_actions_per_episode)
    noise, per_turn = run_args.warm_start_noise, run_args.warm_start_actions_per_turn
    demos = demonstrations(
        tokenizer, eos, env.env_id, dict(env.env_kwargs), seeds, noise, rollout_config(args), per_turn
    )
    return {"random_mover": random_mover_success(make, seeds, *budget), "teacher": sum(demos["success"]) / len(seeds)}


def stamp() -> dict:
    """When and at which commit an env's results were measured (sections merge envs run at different times)."""
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"env_measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit.stdout.strip()}


def kept_results(section: str) -> dict:
    """The envs of ``section`` that this run does not measure again."""
    from experiments.report import load

    return {k: v for k, v in load().get(section, {}).get("per_env", {}).items() if k not in ENVS}


ENVS = STRATEGY_ENVS

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "parts",
        nargs="*",
        help="ratios, strategies, windows, warm, credit, refill, overlong (default: ratios strategies)",
    )
    parser.add_argument(
        "--max_steps", type=int, help="override the recipes' RL steps (a quick check; not for results)"
    )
    parser.add_argument("--env", action="append", help="strategies / windows on this env only (repeatable)")
    cli = parser.parse_args()
    ENVS = tuple(cli.env or STRATEGY_ENVS)
    parts = cli.parts or ["ratios", "strategies"]
    if set(parts) - {"ratios", "strategies", "windows", "warm", *COMPARISONS}:
        parser.error(f"parts are ratios, strategies, windows, warm, {', '.join(COMPARISONS)}; got {parts}")
    if cli.max_steps:
        QUICK = True
        RECIPES = {k: (recipe, cli.max_steps) for k, (recipe, _) in RECIPES.items()}
    for part in parts:
        run = {"ratios": ratios, "strategies": strategies, "windows": windows, "warm": warm_starts}.get(part)
        run() if run else compare(part)
