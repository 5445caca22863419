"""Success rate of a model on held-out start states.

    python evaluate.py --model_name_or_path runs/demo/frozenlake --env_id starpo/FrozenLake-v0 \
        --env_kwargs '{"is_slippery": false}' --num_episodes 256

Plays ``num_episodes`` episodes from seeds ``[seed_offset, seed_offset + num_episodes)`` (the same
held-out seeds the trainer evaluates on by default) at ``temperature`` and prints a table;
``--output FILE`` also writes the metrics as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from starpo_trl.evaluation import episode_metrics
from starpo_trl.models import eos_token_ids
from starpo_trl.rollout import HFBackend, RolloutConfig, RolloutEngine, StartState


def evaluate(model, tokenizer, env_id: str, env_kwargs: dict, num_episodes: int, seed_offset: int, temperature: float, config: RolloutConfig, batch_size: int = 256) -> dict:
    eos_ids = eos_token_ids(tokenizer, model.generation_config.eos_token_id)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    engine = RolloutEngine(tokenizer, HFBackend(model, pad, eos_ids), config, eos_ids)
    kwargs = tuple(sorted(env_kwargs.items()))
    episodes = []
    for start in range(seed_offset, seed_offset + num_episodes, batch_size):
        seeds = range(start, min(start + batch_size, seed_offset + num_episodes))
        episodes += engine.run([StartState(env_id, s, kwargs) for s in seeds], temperature)
    return {"env_id": env_id, "episodes": num_episodes, "temperature": temperature, **episode_metrics(episodes)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_name_or_path", required=True)
    p.add_argument("--env_id", required=True)
    p.add_argument("--env_kwargs", default="{}", help="JSON object of kwargs for gymnasium.make")
    p.add_argument("--num_episodes", type=int, default=256)
    p.add_argument("--seed_offset", type=int, default=10_000_000)
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--max_turns", type=int, default=5)
    p.add_argument("--max_actions_per_turn", type=int, default=5)
    p.add_argument("--max_actions_per_episode", type=int, default=10)
    p.add_argument("--max_tokens_per_turn", type=int, default=256)
    p.add_argument("--no_think", action="store_true", help="Ask for <answer> only")
    p.add_argument("--output", help="Write the metrics here as JSON")
    a = p.parse_args(argv)

    from starpo_trl.envs_registry import check_env_id

    check_env_id(a.env_id)
    env_kwargs = json.loads(a.env_kwargs)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(a.model_name_or_path, dtype="auto")
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    config = RolloutConfig(
        max_turns=a.max_turns, max_actions_per_turn=a.max_actions_per_turn, max_actions_per_episode=a.max_actions_per_episode,
        max_tokens_per_turn=a.max_tokens_per_turn, enable_think=not a.no_think,
    )
    torch.manual_seed(0)
    result = evaluate(model, tokenizer, a.env_id, env_kwargs, a.num_episodes, a.seed_offset, a.temperature, config)
    width = max(len(k) for k in result)
    print("\n".join(f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}" for k, v in result.items()))
    if a.output:
        with open(a.output, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
