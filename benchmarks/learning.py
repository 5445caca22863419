"""The paper's finding 4 at small scale: variance-filter keep ratio 1.0 vs 0.5 vs 0.25.

    python benchmarks/learning.py         # about 30 minutes on 2 CPU cores (make bench-learning)

For Bandit and FrozenLake (the CPU demo recipes): one warm start, then for each keep ratio and
seed 0, 1, 2 a StarPO run from that same warm-started model; reports final held-out success,
the step where training collapsed (if any) and wall time, draws one PNG per env, and says whether
the paper's ordering held. Collapse: the 5-step moving average of training success falls below
half of its best value so far (after step 10).
"""

from __future__ import annotations

import pathlib
import sys
import time
import warnings

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
warnings.filterwarnings("ignore")

RATIOS = (1.0, 0.5, 0.25)
SEEDS = (0, 1, 2)
RECIPES = {"starpo/Bandit-v0": ("demo-cpu-bandit.yaml", 10), "starpo/FrozenLake-v0": ("demo-cpu-frozenlake.yaml", 60)}
OUT = ROOT / "runs" / "bench-learning"


def parse(recipe: str, **overrides):
    import yaml
    from trl import ModelConfig, TrlParser

    from starpo_trl import StarPOConfig
    from starpo_trl.config import RunArguments
    from starpo_trl.models import TinyModelArguments

    config = {**yaml.safe_load((ROOT / "recipes" / recipe).read_text()), **overrides}
    return TrlParser((RunArguments, StarPOConfig, ModelConfig, TinyModelArguments)).parse_dict(config)


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


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from report import store
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.models import load_model_and_tokenizer
    from starpo_trl.monitoring.plotting import series
    from starpo_trl.warm_start import warm_start_from_config

    results = {}
    for env_id, (recipe, max_steps) in RECIPES.items():
        from envs.contract import env_name

        name = env_name(env_id)
        warm_dir = OUT / name / "warm"
        run_args, args, model_args, tiny_args = parse(recipe, output_dir=str(warm_dir))
        if not (warm_dir / "model.safetensors").exists():
            model, tok = load_model_and_tokenizer(model_args, tiny_args, seed=0)
            model = warm_start_from_config(model, tok, run_args, args, str(warm_dir / "sft"))
            model.save_pretrained(warm_dir)
            tok.save_pretrained(warm_dir)
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
                tok = AutoTokenizer.from_pretrained(warm_dir)
                trainer = MultiTurnStarPOTrainer(
                    AutoModelForCausalLM.from_pretrained(warm_dir), args, processing_class=tok
                )
                trainer.train()
                final = trainer.evaluate_success()["success"]
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
        png = HERE / f"learning-{name}.png"  # committed beside the results
        fig.savefig(png, dpi=100)
        plt.close(fig)
        mean = {r: sum(x["final_success"] for x in runs if x["ratio"] == r) / len(SEEDS) for r in RATIOS}
        results[env_id] = {
            "runs": runs,
            "mean_final_success": mean,
            "png": str(png.relative_to(ROOT)),
            "paper_ordering_held": mean[0.25] >= mean[0.5] >= mean[1.0],
        }
    store("learning", {"per_env": results, "ratios": list(RATIOS), "seeds": list(SEEDS)})


if __name__ == "__main__":
    main()
