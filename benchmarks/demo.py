"""The CPU demo (`make train`): held-out success before and after StarPO-S, stored with its provenance.

    python benchmarks/demo.py                # make train: seed 0 into runs/demo/, section "demo"
    python benchmarks/demo.py --seeds 1 2    # the same on more seeds, section "demo_seeds" (README: with seed 0)
    python benchmarks/demo.py --note "make test ran beside it"   # what the numbers alone do not say

Each recipe (Bandit, then FrozenLake) runs `train.py --config RECIPE --seed S` in a child process;
its report gives success on the recipe's held-out episodes after the warm start and after RL.
Each run uses one torch thread (the recipes' ``torch_threads: 1``). Per env: before, after, the gain,
its standard error (two proportions on the same number of episodes,
``sqrt(p0 (1 - p0) / n + p1 (1 - p1) / n)``: the held-out seeds are the same before and after, so
this errs on the large side), the gain in standard errors, RL steps and wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import subprocess
import sys
import time

import yaml

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

import report  # noqa: E402  (records the code's commit as the run starts)

RECIPES = ("recipes/demo-cpu-bandit.yaml", "recipes/demo-cpu-frozenlake.yaml")


def gain(before: float, after: float, n: int) -> dict:
    """The change in success on ``n`` held-out episodes, with its standard error."""
    se = math.sqrt(before * (1 - before) / n + after * (1 - after) / n)
    return {
        "gain": round(after - before, 4),
        "standard_error": round(se, 4),
        "gain_in_standard_errors": round((after - before) / se, 2) if se > 0 else None,
    }


def run(recipe: str, seed: int) -> dict:
    """``train.py`` on ``recipe`` with ``seed``; seed 0 writes where the recipe says (runs/demo/)."""
    config = yaml.safe_load((ROOT / recipe).read_text())
    out = config["output_dir"] if seed == 0 else f"{config['output_dir']}-seed{seed}"
    extra = [] if seed == 0 else ["--output_dir", out, "--report_path", ""]
    start = time.time()
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", recipe, "--seed", str(seed), "--disable_tqdm", "true"]
    subprocess.run(cmd + extra, cwd=ROOT, check=True)  # one torch thread: the recipes' torch_threads
    result = json.loads((ROOT / out / "report.json").read_text())
    before, after, n = result["success_before"], result["success_after"], result["episodes"]
    return {
        "success_before": before,
        "success_after": after,
        "episodes": n,
        **gain(before, after, n),
        "rl_steps": config["max_steps"],
        "wall_seconds": round(time.time() - start, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--note", help="stored with the section, e.g. what else ran on the machine")
    args = p.parse_args(argv)
    note = {"note": args.note} if args.note else {}
    env_ids = {recipe: yaml.safe_load((ROOT / recipe).read_text())["env_id"] for recipe in RECIPES}
    start = time.time()
    if args.seeds == [0]:
        section = {env_ids[recipe]: {"recipe": recipe, **run(recipe, 0)} for recipe in RECIPES}
        report.store("demo", {**section, **note}, seeds=[0], wall_seconds=time.time() - start)
        return section
    section = {}
    for recipe, env_id in env_ids.items():
        per_seed = {str(seed): run(recipe, seed) for seed in args.seeds}
        gains = [r["gain"] for r in per_seed.values()]
        section[env_id] = {
            "recipe": recipe,
            "per_seed": per_seed,
            "mean_gain": round(sum(gains) / len(gains), 4),
            "min_gain": min(gains),
            "max_gain": max(gains),
        }
    report.store("demo_seeds", {**section, **note}, seeds=args.seeds, wall_seconds=time.time() - start)
    return section


if __name__ == "__main__":
    main()
