"""SmolLM2-135M-Instruct (offline, `make model`): zero-shot baselines and StarPO runs on 2 CPU cores.

    python -m experiments.real_model baseline [ENV_ID ...] [--episodes N]   # make bench-real (all envs below)
    python -m experiments.real_model rl RECIPE [TRAIN.PY FLAGS ...]           # e.g. experiments/recipes/smollm2-cpu-bandit-lora.yaml
    python -m experiments.real_model record RECIPE RUN_DIR [--peak_rss_mib M] [--note TEXT] [FLAGS ...]  # a run made with train.py --config RECIPE [FLAGS]
    python -m experiments.real_model speed                                    # rollout and step speed ratios
    python -m experiments.real_model decode [--rows 64 --cached 1200 --steps 32] # the sampling cache, side by side

`baseline`: `evaluate.py` on the unmodified model, held-out episodes at temperature 0.5 with
StarPOConfig's default episode settings (5 turns, 256 tokens per turn, think format), one env
after another; merged env by env into experiments/results.json ("real_model" -> "baseline"), so a
partial run keeps the others.

`rl`: `train.py --config RECIPE` in a child process (its peak memory measured), then `record`:
the run's held-out success and format-error rate before and after RL (train.py evaluates both),
wall time, step time and curves (success, format-error rate, in-group reward std, entropy) go to
"real_model" -> "runs" (one entry per recipe) and experiments/README.md, the curves to
experiments/figures/real-<recipe>.png. "start" says where RL began: "base" (the model as it is) or "sft"
(after the recipe's warm start). A Bandit recipe with the payouts shown and no <think> is then
probed by experiments/bandit_reading.py (does the policy read the payouts or pick by name), stored
under "real_model" -> "reading" -> the run's output_dir.

`speed`: benchmarks/speed.py's measures on this model, each a ratio measured side by side in one
run: 32 Sokoban episodes x 5 turns (24 tokens per turn) with the HF backend's KV reuse off and on
(`kv_reuse_speedup`), the engine against bare `model.generate` replaying the same inputs
(`rollout_overhead_ratio`), the tokens read before sampling per episode at each turn, and one
training step against TRL's `GRPOTrainer` on single-turn Bandit, per model token
(`step_time_ratio_vs_trl_grpo`; full fine-tune, 8 replies of 32 tokens: 2 prompts x 4). Merged
into "real_model".

`decode`: one decode step of the HF backend with its sampling cache allocated once per call and
written in place, against transformers' concatenating `DynamicLayer` given the same kept rows:
`--rows` episodes with `--cached` tokens of history each (random token ids, read once), then
`--steps` sampled tokens, alternately with each cache (median of 2 calls each; the draws must be
the same). Seconds per decode step and their ratio (`sampling_cache_speedup`) into "real_model".
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import yaml
from transformers.cache_utils import DynamicLayer

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

from experiments import report  # noqa: E402,F401  (records the code's commit as the run starts)

ENVS = [
    "starpo/Bandit-v0",
    "starpo/BanditTest-v0",
    "starpo/BanditSymbolic-v0",
    "starpo/BanditSymbolicTest-v0",
    "starpo/Countdown-v0",
    "starpo/Arithmetic-v0",
    "starpo/FrozenLake-v0",
    "starpo/Sokoban-v0",
]
EPISODES = 256


def baseline(env_ids: list[str], episodes: int = EPISODES, batch_size: int = 64) -> dict:
    """``batch_size`` episodes per engine call: the untouched model's replies run to the token limit
    every turn, and 256 five-turn episodes in one call hold a KV cache of about 12 GB."""

    import evaluate
    from starpo_trl.offline_model import build

    model = build()
    section = dict(report.load().get("real_model", {}))
    base = dict(section.get("baseline", {}))
    for env_id in env_ids:
        out = pathlib.Path(tempfile.mkdtemp()) / "eval.json"
        start = time.time()
        code = evaluate.main(
            [
                "--model_name_or_path",
                model,
                "--env_id",
                env_id,
                "--num_episodes",
                str(episodes),
                "--temperature",
                "0.5",
                "--batch_size",
                str(batch_size),
                "--output",
                str(out),
            ]
        )
        if code == 2:
            raise RuntimeError(f"evaluate.py refused {env_id}")
        r = json.loads(out.read_text())
        base[env_id] = {k: r[k] for k in ("success", "format_error_rate", "valid_action_rate", "turns", "env_errors")}
        base[env_id].update(episodes=episodes, wall_seconds=round(time.time() - start, 1))
        base[env_id]["provenance"] = report.provenance(range(episodes), time.time() - start)
        print(env_id, base[env_id], flush=True)
        section.update(temperature=0.5, baseline=base)
        report.store_real_model(section, range(episodes), time.time() - start)
    return base


SLUG_CHARS = 60  # a longer slug of a run's flags (a format line, say) is cut and ends with their hash


def flags_slug(flags: list[str]) -> str:
    """A run's flags as a file-name part: letters and digits, the rest as '-'; flags longer than ``SLUG_CHARS``
    are cut there and given 8 hex digits of their SHA-1, so two long sets of flags never share a name."""
    import hashlib

    text = " ".join(flags)
    slug = "".join(c if c.isalnum() else "-" for c in text.lstrip("-")).strip("-")
    if len(slug) <= SLUG_CHARS:
        return slug
    return slug[:SLUG_CHARS].rstrip("-") + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]


def record(
    recipe: str,
    run_dir: str,
    peak_rss_mib: float | None = None,
    flags: list[str] | None = None,
    note: str | None = None,
) -> dict:
    """One finished `train.py --config RECIPE [FLAGS]` run (its output_dir) as a "runs" entry (one
    per recipe and flags). With several eval envs (``eval_env_configs``) each one's before/after
    goes to ``eval_envs``; ``success_before/after`` are then the first of ``eval_env_configs``.
    ``note``: what the numbers alone do not say (e.g. another job shared the CPU), printed under the table."""

    import train
    from envs.contract import env_name
    from starpo_trl.monitoring.plotting import plot_curves

    flags = list(flags or [])
    # the settings the run was made with: train.py's own parser over the recipe and the flags
    run_args, args, model_args, _ = train.parser().parse_args_and_config(args=["--config", recipe, *flags])
    out = json.loads((pathlib.Path(run_dir) / "report.json").read_text())
    history = out["log_history"]
    steps = [row["step_time"] for row in history if "step_time" in row]
    name = pathlib.Path(recipe).stem
    png = HERE / "figures" / f"real-{name}{'-' + flags_slug(flags) if flags else ''}.png"
    png.parent.mkdir(exist_ok=True)
    plot_curves(history, env_name(args.env_id), str(png), title=f"{name} {' '.join(flags)}".strip())
    warm, noise = run_args.warm_start_episodes, run_args.warm_start_noise
    before, after = out["before"] or {}, out["after"]
    names = [k[: -len("/success")] for k in after if k.endswith("/success")]
    per_env = {
        n: {
            "success_before": before.get(f"{n}/success"),
            "success_after": after[f"{n}/success"],
            "format_error_before": before.get(f"{n}/format_error_rate"),
            "format_error_after": after.get(f"{n}/format_error_rate"),
        }
        for n in names
    }
    # with several eval envs the first of eval_env_configs is the run's headline (its held-out variant)
    primary = per_env.get(args.eval_envs()[0].name, {}) if out.get("env_id") is None else {}
    run = {
        "recipe": f"recipes/{pathlib.Path(recipe).name}",
        "flags": " ".join(flags),
        "env_id": args.env_id,
        "eval_env_id": out.get("env_id") or args.eval_envs()[0].env_id,
        "start": "sft" if warm else "base",
        "warm_start": (
            f"{warm} demonstrations, noise {noise}" + (" (format only: random actions)" if noise == 1.0 else "")
        )
        if warm
        else None,
        "lora": bool(model_args.use_peft),
        "success_before": primary.get("success_before", out.get("success_before")),
        "success_after": primary.get("success_after", out.get("success_after")),
        "format_error_before": primary.get("format_error_before", before.get("format_error_rate")),
        "format_error_after": primary.get("format_error_after", after["format_error_rate"]),
        "eval_envs": per_env,
        "episodes": out["episodes"],
        "max_steps": max((row["step"] for row in history), default=0),
        "step_seconds_median": round(statistics.median(steps), 1) if steps else None,
        "wall_seconds": out["wall_seconds"],
        "peak_rss_mib": None if peak_rss_mib is None else round(peak_rss_mib),
        "curves": png.name,
        **({"note": note} if note else {}),
    }
    section = dict(report.load().get("real_model", {}))
    same = lambda r: (r["recipe"], r.get("flags", "")) == (run["recipe"], run["flags"])  # noqa: E731
    run["provenance"] = report.provenance([args.seed], out["wall_seconds"])
    section.update(runs=[r for r in section.get("runs", []) if not same(r)] + [run])
    report.store_real_model(section, [args.seed], out["wall_seconds"])
    print(json.dumps(run, indent=2))
    return run


def rl(recipe: str, extra: list[str]) -> dict:
    from starpo_trl.offline_model import build

    build()  # the model directory the recipes point at
    config = yaml.safe_load(pathlib.Path(recipe).read_text())
    run_dir, flags = config["output_dir"], []  # flags: what changes the run (not where it is written)
    i = 0
    while i < len(extra):
        if extra[i] in ("--output_dir", "--report_path") and i + 1 < len(extra):
            run_dir = extra[i + 1] if extra[i] == "--output_dir" else run_dir
            i += 2
            continue
        flags.append(extra[i])
        i += 1
    subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--config", recipe, "--disable_tqdm", "true", *extra],
        check=True,
        cwd=ROOT,
    )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    run = record(recipe, str(ROOT / run_dir), peak, flags=flags)
    if reads_payouts(recipe, flags):
        from experiments import bandit_reading

        bandit_reading.main([recipe, str(ROOT / run_dir), "--label", run_dir, *flags])
    return run


def reads_payouts(recipe: str, flags: list[str]) -> bool:
    """Whether `rl` follows the run with experiments/bandit_reading.py: a Bandit recipe with the payouts
    shown and no <think> (the probe scores bare answers against the payout lines)."""
    import gymnasium as gym

    import train
    from envs.bandit import BanditEnv

    _, cfg, _, _ = train.parser().parse_args_and_config(args=["--config", recipe, *flags])
    # the registry's kwargs and the recipe's, as training sees them
    env = gym.make(cfg.env_id, **cfg.env_kwargs).unwrapped
    return isinstance(env, BanditEnv) and env.show_payouts and not cfg.enable_think


def speed_rows(repeats: int = 3) -> dict:
    import speed
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from starpo_trl.offline_model import build

    torch.set_num_threads(2)
    model_dir = build()
    tok = AutoTokenizer.from_pretrained(model_dir)

    def load():
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    model = load().eval()
    rows = speed.rollout_rows(model, tok, repeats=repeats, sequential=False)
    del model
    rows.update(speed.step_time_rows(tok, load, batch=8, generations=4, steps=4, repeats=repeats))
    section = dict(report.load().get("real_model", {}))
    section.update(rows, speed_provenance=report.provenance(range(repeats)))
    report.store_real_model(section, range(repeats))
    print(json.dumps(rows, indent=2))
    return rows


class ConcatenatingLayer(DynamicLayer):
    """transformers' own cache layer (a copy of the whole cache per token), given the kept rows as the
    HF backend lays them out: the reference its in-place ``_CallLayer`` is measured (``decode``) and
    tested (tests/rollout/test_rollout.py) against."""

    def __init__(self, capacity):
        super().__init__()
        self.capacity = capacity

    def allocate(self, batch, keys, values, device):
        self.device = device
        self.key_buffer = keys.new_zeros((batch, keys.shape[-3], self.capacity, keys.shape[-1]))
        self.value_buffer = values.new_zeros((batch, values.shape[-3], self.capacity, values.shape[-1]))

    def advance(self, n):
        self.keys, self.values = self.key_buffer[:, :, :n].clone(), self.value_buffer[:, :, :n].clone()
        self.key_buffer = self.value_buffer = None
        self.is_initialized = True

    def free(self):
        self.keys = self.values = None


def decode_rows(rows: int = 64, cached: int = 1200, steps: int = 32, repeats: int = 2) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from starpo_trl.offline_model import build
    from starpo_trl.rollout import hf_backend

    torch.set_num_threads(2)
    model_dir = build()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    history = [torch.randint(100, len(tok) - 100, (cached,), generator=g).tolist() for _ in range(rows)]
    backend = hf_backend.HFBackend(
        model, tok.pad_token_id, [len(tok) + 1]
    )  # no end token: every row samples `steps` tokens
    first = backend.generate(history, 1, 0.5)
    kept = backend._kept
    nxt = [tokens + [reply[0][0], tok.pad_token_id] for (tokens, _), reply in zip(kept, first)]
    seconds, draws, own = {"preallocated": [], "concatenating": []}, {}, hf_backend._CallLayer
    try:
        for _ in range(repeats):
            for name, layer in (("preallocated", own), ("concatenating", ConcatenatingLayer)):
                hf_backend._CallLayer = layer
                backend._kept = [(t, [(k.clone(), v.clone()) for k, v in rows_]) for t, rows_ in kept]
                torch.manual_seed(0)
                start = time.perf_counter()
                out = backend.generate(nxt, steps, 0.5)
                seconds[name].append((time.perf_counter() - start) / steps)
                draws.setdefault(name, [ids for ids, _ in out])
    finally:
        hf_backend._CallLayer = own
    if draws["preallocated"] != draws["concatenating"]:
        raise RuntimeError("the two caches drew different tokens")
    pre, cat = statistics.median(seconds["preallocated"]), statistics.median(seconds["concatenating"])
    result = {
        "decode_step_seconds": {
            "rows": rows,
            "cached_tokens": cached,
            "steps": steps,
            "preallocated": [round(x, 3) for x in seconds["preallocated"]],
            "concatenating": [round(x, 3) for x in seconds["concatenating"]],
        },
        "sampling_cache_speedup": round(cat / pre, 3),
    }
    section = dict(report.load().get("real_model", {}))
    section.update(result, decode_provenance=report.provenance([0]))
    report.store_real_model(section, [0])
    print(json.dumps(result, indent=2))
    return result


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")
    b = sub.add_parser("baseline")
    b.add_argument("env_ids", nargs="*")
    b.add_argument("--episodes", type=int, default=EPISODES)
    b.add_argument("--batch_size", type=int, default=64)
    r = sub.add_parser("rl")
    r.add_argument("recipe")
    c = sub.add_parser("record")
    c.add_argument("recipe")
    c.add_argument("run_dir")
    c.add_argument("--peak_rss_mib", type=float)
    c.add_argument("--note", help="what the numbers alone do not say, printed under the runs table")
    sub.add_parser("speed")
    d = sub.add_parser("decode")
    d.add_argument("--rows", type=int, default=64)
    d.add_argument("--cached", type=int, default=1200)
    d.add_argument("--steps", type=int, default=32)
    args, extra = p.parse_known_args(argv)
    if args.command in (None, "baseline"):
        if extra:
            p.error(f"unknown arguments {extra}")
        baseline(
            getattr(args, "env_ids", None) or ENVS,
            getattr(args, "episodes", EPISODES),
            getattr(args, "batch_size", 64),
        )
    elif args.command == "rl":
        rl(args.recipe, extra)
    elif args.command == "speed":
        if extra:
            p.error(f"unknown arguments {extra}")
        speed_rows()
    elif args.command == "decode":
        if extra:
            p.error(f"unknown arguments {extra}")
        decode_rows(args.rows, args.cached, args.steps)
    else:
        record(args.recipe, args.run_dir, args.peak_rss_mib, flags=extra, note=args.note)


if __name__ == "__main__":
    main(sys.argv[1:])
