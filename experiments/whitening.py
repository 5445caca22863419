"""Advantage whitening for the critic estimators: the critic demo runs with and without it.

    python -m experiments.whitening       # about 15 minutes on 2 CPU cores (make bench-whitening)

`recipes/demo-cpu-frozenlake-ppo.yaml` (tiny model, warm start, `gae`, full critic) and the same
with `--advantage_estimator bilevel_gae --use_turn_rewards true`, each with
`--whiten_advantages true` (the default, as RAGEN, VAGEN and verl) and `false`: the same seed, so
both start from the same warm-started model and the same first rollout. The runs of one estimator
go side by side (two processes, one thread each). Reported: held-out success before and after RL
(256 episodes), the critic's explained variance over windows of 20 rollouts, the advantages' spread,
and wall time. Results go to experiments/results.json ("whitening") and experiments/README.md.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

from experiments import report  # noqa: E402,F401  (records the code's commit as the run starts)

OUT = ROOT / "runs" / "bench-whitening"
ESTIMATORS = {"gae": [], "bilevel_gae": ["--advantage_estimator", "bilevel_gae", "--use_turn_rewards", "true"]}


def window_means(values: list[float], width: int = 20) -> list[float]:
    return [round(sum(values[i : i + width]) / len(values[i : i + width]), 3) for i in range(0, len(values), width)]


def summarise(run_dir: pathlib.Path, wall: float) -> dict:
    report = json.loads((run_dir / "report.json").read_text())
    rows = [r for r in report["log_history"] if "critic/explained_variance" in r]
    ev = [r["critic/explained_variance"] for r in rows]
    return {
        "success_before": report["success_before"],
        "success_after": report["success_after"],
        "explained_variance_by_20_steps": window_means(ev),
        "advantages_std_mean": round(sum(r.get("advantages/std", 0.0) for r in rows) / max(1, len(rows)), 4),
        "wall_seconds": round(wall, 1),
    }


def main() -> dict:

    results = {"recipe": "recipes/demo-cpu-frozenlake-ppo.yaml", "runs": {}}
    for name, extra in ESTIMATORS.items():
        procs = {}
        for whiten in ("true", "false"):
            out = OUT / f"{name}-whiten-{whiten}"
            cmd = [
                sys.executable,
                str(ROOT / "train.py"),
                "--config",
                str(ROOT / "recipes/demo-cpu-frozenlake-ppo.yaml"),
                *extra,
                "--whiten_advantages",
                whiten,
                "--output_dir",
                str(out),
                "--report_path",
                f"{out}.report.json",
                "--disable_tqdm",
                "true",
            ]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            procs[whiten] = (
                subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(f"{out}.log", "w")),
                time.time(),
                out,
            )
        for whiten, (proc, start, out) in procs.items():
            if proc.wait() != 0:
                raise RuntimeError(f"{name} whiten={whiten} failed: see {out}.log")
            results["runs"][f"{name}, whiten {whiten}"] = summarise(out, time.time() - start)
    report.store("whitening", results, seeds=[0])
    return results


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    print(json.dumps(main(), indent=2))
