"""Does the critic learn the return where the return can be learned? `recipes/demo-cpu-frozenlake-critic.yaml`.

    python -m experiments.critic                 # gae, 80 steps: about 45 minutes on 2 CPU cores
    python -m experiments.critic bilevel_gae     # bilevel_gae with turn rewards, 110 steps

The recipe: the tiny offline model, a warm start, 32 repeating lakes (so the policy can settle on each), no variance
filter, a full critic from the weights before the warm start, 8 shuffled critic passes per batch. Reported from the
run's log: held-out success before and after RL (128 episodes of unseen lakes); the critic's explained variance
(model tokens, each step's fresh rollouts, before the critic trains on them) as the mean over windows of 20 steps,
its peak, and the share of steps above 0.3; the values' std against the returns' over the last 20 steps; and
`reward_between_group_share` (the share of the reward variance between start states: about what a critic that knows
only the start state could explain) over the same windows. One step's batch holds 8 lakes, so a single step's
explained variance is noisy; read the windows. Into experiments/results.json ("critic_recipe", one entry per
estimator) and experiments/README.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

from experiments import report  # noqa: E402  (records the code's commit as the run starts)
from experiments.whitening import window_means as windows  # noqa: E402  (means over windows of 20 values)

RECIPE = "recipes/demo-cpu-frozenlake-critic.yaml"
OUT = ROOT / "runs" / "experiment-critic"
VARIANTS = {
    "gae": [],
    "bilevel_gae": ["--advantage_estimator", "bilevel_gae", "--use_turn_rewards", "true", "--max_steps", "110"],
}
WINDOW = 20


def summarise(log_history: list[dict], success_before: float, success_after: float, env: str) -> dict:
    """The reported figures of one run from its Trainer log history (see the module docstring)."""
    rows = [r for r in log_history if "critic/explained_variance" in r]
    ev = [float(r["critic/explained_variance"]) for r in rows]
    last = rows[-WINDOW:]
    share_key = f"env/{env}/reward_between_group_share"
    shares = [float(r[share_key]) for r in log_history if r.get(share_key) is not None]
    return {
        "success_before": success_before,
        "success_after": success_after,
        "steps": len(ev),
        "explained_variance_by_window": windows(ev),
        "explained_variance_peak": round(max(ev), 3) if ev else None,
        "steps_above_0_3": sum(v > 0.3 for v in ev),
        "values_std_last": round(statistics.fmean(float(r["values/std"]) for r in last), 3) if last else None,
        "returns_std_last": round(statistics.fmean(float(r["returns/std"]) for r in last), 3) if last else None,
        "between_group_share_by_window": windows(shares),
    }


def run(variant: str) -> dict:
    """The recipe with ``variant``'s flags through train.py; its summary and wall time."""
    out = OUT / variant
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / RECIPE), *VARIANTS[variant]]
    cmd += ["--output_dir", str(out), "--report_path", f"{out}.report.json", "--disable_tqdm", "true"]
    start = time.time()
    with open(f"{out}.log", "w") as log:
        if subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log).returncode != 0:
            raise RuntimeError(f"{variant} failed: see {out}.log")
    result = json.loads((out / "report.json").read_text())
    summary = summarise(result["log_history"], result["success_before"], result["success_after"], "FrozenLake-v0")
    wall = round(time.time() - start, 1)
    return {**summary, "flags": VARIANTS[variant], "wall_seconds": wall, "provenance": report.provenance([0], wall)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variant", nargs="?", default="gae", choices=sorted(VARIANTS))
    a = p.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    stored = report.read(report.RESULTS).get("critic_recipe", {})  # the other estimator's run, with its provenance
    runs = {**stored.get("runs", {}), a.variant: run(a.variant)}
    report.store(
        "critic_recipe", {"recipe": RECIPE, "runs": runs}, seeds=[0], wall_seconds=runs[a.variant]["wall_seconds"]
    )
    return runs[a.variant]


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
