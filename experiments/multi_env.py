"""One policy on Bandit + FrozenLake + Sokoban next to single-env runs of the same budget.

    python -m experiments.multi_env     # make bench-multienv; about 20 minutes on 2 CPU cores

The multi-env run is `recipes/demo-cpu-multienv.yaml` (tiny offline model; each step 2 Bandit, 3
FrozenLake and 3 Sokoban start states x 8 episodes, the filter's quota per env; 600 warm-start
demonstrations split between the envs). Each single-env run takes the same recipe with one env:
the same steps, episodes per step and warm-start demonstrations, all on that env, so every run
plays the same number of episodes. Held-out success on 256 episodes of each eval env (BanditTest's
arm names never appear in training); into results.json "multi_env" and experiments/README.md.
"""

from __future__ import annotations

import pathlib
import time
import warnings

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

from experiments import report  # noqa: E402,F401  (records the code's commit as the run starts)

warnings.filterwarnings("ignore")

RECIPE = "demo-cpu-multienv.yaml"
OUT = ROOT / "runs" / "bench-multienv"


def run(name: str, **overrides) -> dict:
    """Warm start and StarPO as train.py does (without its report); the held-out metrics and wall time."""
    from experiments.learning import parse
    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.models import load_model_and_tokenizer
    from starpo_trl.warm_start import warm_start_from_config

    start = time.time()
    run_args, args, model_args, tiny_args = parse(RECIPE, output_dir=str(OUT / name), **overrides)
    model, tok = load_model_and_tokenizer(model_args, tiny_args, seed=args.seed)
    model = warm_start_from_config(model, tok, run_args, args)
    trainer = MultiTurnStarPOTrainer(model, args, processing_class=tok)
    trainer.train()
    metrics = trainer.evaluate_success()
    return {"metrics": metrics, "wall_seconds": round(time.time() - start, 1)}


def main() -> None:
    import yaml

    from experiments.report import store

    recipe = yaml.safe_load((ROOT / "recipes" / RECIPE).read_text())
    multi = run("multi")
    print("multi", multi, flush=True)
    rows = []
    for train, evaluation in zip(recipe["env_configs"], recipe["eval_env_configs"]):
        from envs.contract import env_name

        eval_name = env_name(evaluation["env_id"])
        single = run(
            env_name(train["env_id"]),
            env_configs=None,
            eval_env_configs=None,
            env_id=train["env_id"],
            env_kwargs=train.get("env_kwargs") or {},
            eval_env_id=evaluation["env_id"],
            eval_env_kwargs=evaluation.get("env_kwargs") or {},
        )
        print(train["env_id"], single, flush=True)
        rows.append(
            {
                "train_env": train["env_id"],
                "eval_env": evaluation["env_id"],
                "multi_env_success": multi["metrics"][f"{eval_name}/success"],
                "single_env_success": single["metrics"]["success"],
                "single_env_wall_seconds": single["wall_seconds"],
            }
        )
    store(
        "multi_env",
        {
            "recipe": f"recipes/{RECIPE}",
            "rows": rows,
            "multi_env_wall_seconds": multi["wall_seconds"],
            "max_steps": recipe["max_steps"],
            "episodes": recipe["num_eval_episodes"],
        },
        seeds=[recipe["seed"]],
    )


if __name__ == "__main__":
    main()
