"""Success rate of a model on held-out start states, played as the trainer's held-out evaluation plays them.

    python evaluate.py --model_name_or_path runs/demo/frozenlake
    python evaluate.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --env_id starpo/Sokoban-v0 --num_episodes 256

Every episode setting (env and kwargs, seeds, temperature, turn / action / token budgets, think
format, format penalty, reasoning shaping) defaults to what the model was trained with, read from
``starpo_rollout.json`` that training saves next to the model, and otherwise to ``StarPOConfig``'s
own defaults; a flag overrides it. ``--env_id`` naming another env than the model's eval env
takes no saved kwargs (the training env's, if it is that one): pass ``--env_kwargs`` for it.
Plays ``num_episodes`` episodes from seeds ``[seed_offset, seed_offset + num_episodes)`` at
``temperature`` and prints a table; ``--output FILE`` also writes the metrics, the model and every
setting used as JSON, ``--save_episodes FILE`` every episode as a line of JSON (env, seed, success,
reward, turns, format errors, env error and the conversation as text: what the model actually
wrote). Exits with status 1 when an env failed in some episode (the count is printed), 2 on a bad
argument.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from types import SimpleNamespace

import torch

from starpo_trl.config import ROLLOUT_SETTINGS, ROLLOUT_SETTINGS_FILE, StarPOConfig, default_eval_kwargs
from starpo_trl.models import eos_token_ids
from starpo_trl.monitoring.metrics import episode_metrics
from starpo_trl.numeric_settings import check_numbers
from starpo_trl.rollout import HFBackend, RolloutEngine, StartState
from starpo_trl.rollout.settings import ROLLOUT_RANGES, RolloutSettings

# evaluate.py flag -> StarPOConfig field (the flags keep their short names)
RENAMED = {
    "env_id": "eval_env_id",
    "env_kwargs": "eval_env_kwargs",
    "seed_offset": "eval_seed_offset",
    "num_episodes": "num_eval_episodes",
    "temperature": "eval_temperature",
}


def play(
    model,
    tokenizer,
    env_id: str,
    env_kwargs: dict,
    num_episodes: int,
    seed_offset: int,
    temperature: float,
    config,
    batch_size: int = 256,
) -> list:
    """``num_episodes`` episodes of one env, seeds ``seed_offset`` on, ``batch_size`` per engine call."""
    eos_ids = eos_token_ids(tokenizer, model.generation_config.eos_token_id)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    engine = RolloutEngine(tokenizer, HFBackend(model, pad, eos_ids), config, eos_ids)
    kwargs = tuple(sorted(env_kwargs.items()))
    episodes = []
    try:
        for start in range(seed_offset, seed_offset + num_episodes, batch_size):
            seeds = range(start, min(start + batch_size, seed_offset + num_episodes))
            episodes += engine.run([StartState(env_id, s, kwargs) for s in seeds], temperature)
    finally:
        engine.close()
    return episodes


def summary(env_id: str, temperature: float, episodes: list) -> dict:
    """One env's row: its episodes' metrics."""
    return {"env_id": env_id, "episodes": len(episodes), "temperature": temperature, **episode_metrics(episodes)}


def defaults() -> dict:
    """``StarPOConfig``'s own defaults for the rollout settings (the one source of them)."""
    fields = {f.name: f for f in dataclasses.fields(StarPOConfig)}
    out = {}
    for name in ROLLOUT_SETTINGS:
        f = fields[name]
        out[name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return out


def saved_settings(model_dir: str) -> dict:
    path = os.path.join(model_dir, ROLLOUT_SETTINGS_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        saved = json.load(f)
    return {k: v for k, v in saved.items() if k in ROLLOUT_SETTINGS}


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_rollout_flags(p: argparse.ArgumentParser) -> None:
    """One flag per ``RolloutSettings`` field (its type and help from the dataclass), except those under
    evaluate.py's short names (``RENAMED``)."""
    hints = typing.get_type_hints(RolloutSettings)
    for f in dataclasses.fields(RolloutSettings):
        if f.name in RENAMED.values():
            continue
        kind = next(a for a in (typing.get_args(hints[f.name]) or (hints[f.name],)) if a is not type(None))
        text = f"{f.metadata['help']} (default: the model's)"
        if typing.get_origin(kind) is list:
            p.add_argument(f"--{f.name}", nargs="*", help=text)
        else:
            p.add_argument(f"--{f.name}", type=_bool if kind is bool else kind, help=text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_name_or_path", required=True)
    p.add_argument("--env_id", help="default: the model's eval_env_id")
    p.add_argument(
        "--env_kwargs", help="JSON object of kwargs for gymnasium.make (default: the model's eval_env_kwargs)"
    )
    # training's names (num_eval_episodes, eval_seed_offset, eval_temperature) are accepted too
    p.add_argument("--num_episodes", "--num_eval_episodes", dest="num_episodes", type=int)
    p.add_argument("--seed_offset", "--eval_seed_offset", dest="seed_offset", type=int)
    p.add_argument("--temperature", "--eval_temperature", dest="temperature", type=float)
    add_rollout_flags(p)
    p.add_argument("--batch_size", type=int, default=256, help="episodes per engine call")
    p.add_argument("--output", help="write the metrics and settings here as JSON")
    p.add_argument("--save_episodes", help="write every episode here, one JSON object per line (JSON Lines)")
    p.add_argument("--traceback", action="store_true", help="on a refused setting, show the whole traceback")
    return p


def table(metrics: dict) -> str:
    """The metrics as two aligned columns."""
    width = max(len(k) for k in metrics)
    return "\n".join(
        f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}" for k, v in metrics.items()
    )


def save_episodes(path: str, played: dict[str, list]) -> None:
    """Every episode, env by env, as JSON Lines (``episode_record``)."""
    with open(path, "w") as f:
        for name, episodes in played.items():
            f.writelines(json.dumps(episode_record(name, ep)) + "\n" for ep in episodes)


def episode_record(name: str, episode) -> dict:
    """One line of ``--save_episodes``: what happened in an episode, and its conversation as text."""
    return {
        "env": name,
        "env_id": episode.start.env_id,
        "seed": episode.start.seed,
        "success": bool(episode.success),
        "reward": episode.reward,
        "turns": episode.num_turns,
        "format_errors": episode.num_format_errors,
        "env_error": episode.env_error,
        "messages": episode.messages,
    }


def resolve(a: argparse.Namespace) -> SimpleNamespace:
    """Flag > the model's saved settings > StarPOConfig's defaults; then checked before any model loads."""
    settings = {**defaults(), **saved_settings(a.model_name_or_path)}
    settings["eval_env_id"] = settings.get("eval_env_id") or settings.get("env_id")
    target = a.env_id or settings["eval_env_id"]
    if settings.get("eval_env_kwargs") is None or target != settings["eval_env_id"]:
        # none saved, or another env than the model's eval env: the saved kwargs were that env's
        settings["eval_env_kwargs"] = default_eval_kwargs(settings.get("env_id"), settings.get("env_kwargs"), target)
    for flag in vars(a):
        value = getattr(a, flag)
        if value is not None and (RENAMED.get(flag, flag) in settings):
            settings[RENAMED.get(flag, flag)] = value
    if isinstance(settings["eval_env_kwargs"], str):
        try:
            settings["eval_env_kwargs"] = json.loads(settings["eval_env_kwargs"])
        except json.JSONDecodeError as err:
            raise ValueError(
                f"--env_kwargs must be a JSON object, got {settings['eval_env_kwargs']!r}: {err}"
            ) from None
    if not isinstance(settings["eval_env_kwargs"], dict):
        raise ValueError(
            f"--env_kwargs must be a JSON object of keyword arguments, got {settings['eval_env_kwargs']!r}"
        )
    if not settings["eval_env_id"]:
        raise ValueError("--env_id is needed: the model has no saved starpo_rollout.json to take it from.")
    if settings["num_eval_episodes"] < 1:
        raise ValueError(f"--num_episodes must be at least 1, got {settings['num_eval_episodes']}")
    rollout = RolloutSettings.of(SimpleNamespace(**settings))
    rollout.check_rollout()  # the same rules as training's config
    check_numbers(rollout, ROLLOUT_RANGES)
    if a.batch_size < 1:
        raise ValueError(f"--batch_size must be at least 1, got {a.batch_size}")
    from envs.contract import check_env_contract, check_env_id, env_name

    # the model's several held-out envs (eval_env_configs), unless --env_id / --env_kwargs pick one
    configs = settings.get("eval_env_configs") if a.env_id is None and a.env_kwargs is None else None
    settings["eval_envs"] = (
        [(c["env_id"], dict(c.get("env_kwargs") or {}), c.get("name") or env_name(c["env_id"])) for c in configs]
        if configs
        else [(settings["eval_env_id"], settings["eval_env_kwargs"], env_name(settings["eval_env_id"]))]
    )
    for env_id, kwargs, _ in settings["eval_envs"]:
        check_env_id(env_id, "--env_id")
        check_env_contract(env_id, kwargs, "--env_id")
    from starpo_trl.rollout.prompting import check_format_instruction

    check_format_instruction(settings["format_instruction"], [(e, k) for e, k, _ in settings["eval_envs"]])
    for flag, path in (("--output", a.output), ("--save_episodes", a.save_episodes)):
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if (
            not os.path.isdir(folder)
            or not os.access(folder, os.W_OK)
            or (os.path.exists(path) and not os.access(path, os.W_OK))
        ):
            raise ValueError(f"{flag} {path!r} cannot be written (its folder must exist and be writable).")
    return SimpleNamespace(**settings, temperature=settings["eval_temperature"])


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        s = resolve(a)
    except ValueError as err:
        if a.traceback:
            raise
        print(f"evaluate.py: {err} (--traceback shows where)", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from starpo_trl.config import rollout_config

    tokenizer = AutoTokenizer.from_pretrained(a.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(a.model_name_or_path, dtype="auto")
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    played = {
        name: play(
            model,
            tokenizer,
            env_id,
            kwargs,
            s.num_eval_episodes,
            s.eval_seed_offset,
            s.eval_temperature,
            rollout_config(s),
            a.batch_size,
        )
        for env_id, kwargs, name in s.eval_envs
    }
    per_env = {name: summary(env_id, s.eval_temperature, played[name]) for env_id, _, name in s.eval_envs}
    if a.save_episodes:
        save_episodes(a.save_episodes, played)
    settings = {name: getattr(s, name) for name in ROLLOUT_SETTINGS}
    if len(per_env) == 1:
        metrics = next(iter(per_env.values()))
        result = {"model": a.model_name_or_path, **metrics, "env_kwargs": s.eval_envs[0][1]}
    else:  # one block (and one row of the output's per_env) per held-out env
        metrics = {f"{name}/{k}": v for name, m in per_env.items() for k, v in m.items()}
        metrics["env_errors"] = sum(m.get("env_errors", 0) for m in per_env.values())
        result = {"model": a.model_name_or_path, "per_env": per_env}
    result.update({"seed_offset": s.eval_seed_offset, "settings": settings})
    print(table(metrics))
    if a.output:
        with open(a.output, "w") as f:
            json.dump(result, f, indent=2)
    errors = int(metrics.get("env_errors", 0))
    if errors:
        print(
            f"evaluate.py: the env failed in {errors} of {s.num_eval_episodes} episodes (see env_errors)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
