"""Which answers a model writes before any training: for a recipe's episode settings, each format line and sampling
temperature, the share of turns answering each of the env's actions, answering something else, or writing no answer
in the format; with the format-error rate and success. RL can only reinforce an action the policy samples: a move
the model never writes is one it cannot learn from reward.

    python -m experiments.answers RECIPE [--episodes 32] [--temperatures 0.5 1.0] [--lines LINE ...]

The model is the recipe's (`model_name_or_path`; SmolLM2 with `make model`), as it is (no warm start), played on the
recipe's held-out env and seeds; the lines default to the recipe's own `format_instruction`. Stored in
experiments/results.json ("answers" -> the recipe -> one row per line and temperature), table in
experiments/README.md.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import time

from experiments import report

NO_ANSWER, OTHER = "no answer", "other"


def answer_counts(episodes, action_names: list[str], enable_think: bool) -> dict[str, int]:
    """Over every model turn of ``episodes`` (their ``messages``): how many answered each action (its first action,
    matched case-insensitively after stripping, as the env matches), something that is no action (``other``), or
    nothing in the format (``no answer``)."""
    from starpo_trl.rollout.prompting import parse_reply

    names = {name.lower(): name for name in action_names}
    counts = collections.Counter({name: 0 for name in [*action_names, OTHER, NO_ANSWER]})
    for ep in episodes:
        for message in ep.messages:
            if message["role"] != "assistant":
                continue
            reply = parse_reply(message["content"], enable_think)
            if not reply.format_ok:
                counts[NO_ANSWER] += 1
            else:
                counts[names.get(reply.actions[0].strip().lower(), OTHER)] += 1
    return dict(counts)


def measure(recipe: str, lines: list[str] | None, temperatures: list[float], episodes: int) -> dict:
    """The recipe's untouched model on ``episodes`` held-out episodes per format line and temperature."""
    import gymnasium as gym
    import torch

    import evaluate
    import train
    from starpo_trl.config import rollout_config
    from starpo_trl.models import load_model_and_tokenizer
    from starpo_trl.monitoring.metrics import episode_metrics

    _, base, model_args, tiny_args = train.parser().parse_args_and_config(args=["--config", recipe])
    if "SmolLM2" in (model_args.model_name_or_path or ""):
        from starpo_trl.offline_model import build

        build()  # the offline model's directory, written once
    model, tok = load_model_and_tokenizer(model_args, tiny_args, seed=base.seed, rollout=rollout_config(base))
    env = base.eval_envs()[0]
    actions = list(gym.make(env.env_id, **dict(env.env_kwargs)).unwrapped.action_names)
    rows = []
    for line in lines or [base.format_instruction]:
        _, config, _, _ = train.parser().parse_args_and_config(args=["--config", recipe, "--format_instruction", line])
        for temperature in temperatures:
            torch.manual_seed(0)
            played = evaluate.play(
                model, tok, env.env_id, dict(env.env_kwargs), episodes, config.eval_seed_offset, temperature,
                rollout_config(config),
            )  # fmt: skip
            stats = episode_metrics(played)
            row = {"format_instruction": line, "temperature": temperature, "episodes": episodes}
            row.update({k: stats[k] for k in ("success", "format_error_rate", "turns")})
            row["answers"] = answer_counts(played, actions, config.enable_think)
            rows.append(row)
            print(row, flush=True)
    return {"env_id": env.env_id, "env_kwargs": dict(env.env_kwargs), "actions": actions, "rows": rows}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--lines", nargs="+", help="format lines (default: the recipe's format_instruction)")
    a = p.parse_args(argv)
    start = time.time()
    entry = measure(a.recipe, a.lines, a.temperatures, a.episodes)
    wall = time.time() - start
    name = f"recipes/{pathlib.Path(a.recipe).name}"
    section = dict(report.load().get("answers", {}))
    recipes = dict(section.get("recipes", {}))
    recipes[name] = {**entry, "provenance": report.provenance(range(a.episodes), wall)}
    report.store("answers", {"recipes": recipes}, seeds=range(a.episodes), wall_seconds=wall)


if __name__ == "__main__":
    main(sys.argv[1:])
