"""Which answers a model writes before any training: for a recipe's episode settings, each format line and sampling
temperature, the share of turns answering each of the env's actions, answering something else, or writing no answer
in the format; with the format-error rate and success. RL can only reinforce an action the policy samples: a move
the model never writes is one it cannot learn from reward.

    python -m experiments.answers RECIPE [--episodes 32] [--temperatures 0.5 1.0] [--lines LINE ...]

Beside them, the success of a mover playing uniformly random actions with the same budget (``--mover_episodes``
held-out start states): how often exploration alone reaches the goal.

The model is the recipe's (`model_name_or_path`; SmolLM2 with `make model`), as it is (no warm start), played on the
recipe's held-out env and seeds; the lines default to the recipe's own `format_instruction`. Stored in
experiments/results.json ("answers" -> the recipe -> one row per line and temperature), table in
experiments/README.md.
"""

from __future__ import annotations

import argparse
import collections
import functools
import pathlib
import sys
import time

from experiments import report

NO_ANSWER, OTHER = "no answer", "other"


def answer_counts(episodes, env, enable_think: bool) -> dict[str, int]:
    """Over every model turn of ``episodes`` (their ``messages``): how many answered each of ``env``'s actions (its
    first action, as the env's own ``match_action`` reads it), something that is no action (``other``), or nothing
    in the format (``no answer``)."""
    from starpo_trl.rollout.prompting import parse_reply

    counts = collections.Counter({name: 0 for name in [*env.action_names, OTHER, NO_ANSWER]})
    for ep in episodes:
        for message in ep.messages:
            if message["role"] != "assistant":
                continue
            reply = parse_reply(message["content"], enable_think)
            if not reply.format_ok:
                counts[NO_ANSWER] += 1
            else:
                index = env.match_action(reply.actions[0])
                counts[OTHER if index is None else env.action_names[index]] += 1
    return dict(counts)


def text_env(env):
    """A fresh text env of an ``EnvConfig`` (its id and kwargs), unwrapped from Gymnasium's checkers."""
    import gymnasium as gym

    return gym.make(env.env_id, **dict(env.env_kwargs)).unwrapped


def random_mover_success(
    make_env, seeds, max_turns: int, actions_per_turn: int, max_actions: int | None = None, seed: int = 0
) -> float:
    """Success of a mover that plays uniformly random actions (``make_env()``'s ``action_names``) from each start
    state (``reset(seed=...)`` of each of ``seeds``), with the episodes' budget: ``max_turns`` turns of
    ``actions_per_turn`` actions, at most ``max_actions`` in all (``max_actions_per_episode``), until the env ends
    the episode. What a policy spread evenly over the actions scores: a reference for how often exploration alone
    reaches the goal."""
    import random

    budget = max_turns * actions_per_turn if max_actions is None else min(max_turns * actions_per_turn, max_actions)
    rng, wins = random.Random(seed), 0
    for start in seeds:
        env = make_env()
        env.reset(seed=start)
        info = {}
        for _ in range(budget):
            _, _, terminated, truncated, info = env.step(rng.choice(env.action_names))
            if terminated or truncated:
                break
        wins += bool(info.get("success", False))
        env.close()
    return wins / len(seeds)


def measure(
    recipe: str, lines: list[str] | None, temperatures: list[float], episodes: int, mover_episodes: int
) -> dict:
    """The recipe's untouched model on ``episodes`` held-out episodes per format line and temperature, and the
    random mover on ``mover_episodes`` held-out start states."""
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
    make = functools.partial(text_env, env)
    played_env = make()
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
            row["answers"] = answer_counts(played, played_env, config.enable_think)
            rows.append(row)
            print(row, flush=True)
    seeds = range(base.eval_seed_offset, base.eval_seed_offset + mover_episodes)
    mover = random_mover_success(make, seeds, base.max_turns, base.max_actions_per_turn, base.max_actions_per_episode)
    return {
        "env_id": env.env_id,
        "env_kwargs": dict(env.env_kwargs),
        "actions": list(played_env.action_names),
        "rows": rows,
        "random_mover": {"success": mover, "episodes": mover_episodes},
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--lines", nargs="+", help="format lines (default: the recipe's format_instruction)")
    p.add_argument("--mover_episodes", type=int, default=4096, help="start states the random mover plays")
    a = p.parse_args(argv)
    start = time.time()
    entry = measure(a.recipe, a.lines, a.temperatures, a.episodes, a.mover_episodes)
    wall = time.time() - start
    name = f"recipes/{pathlib.Path(a.recipe).name}"
    section = dict(report.load().get("answers", {}))
    recipes = dict(section.get("recipes", {}))
    recipes[name] = {**entry, "provenance": report.provenance(range(a.episodes), wall)}
    report.store("answers", {"recipes": recipes}, seeds=range(a.episodes), wall_seconds=wall)


if __name__ == "__main__":
    main(sys.argv[1:])
