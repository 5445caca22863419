"""Does a Bandit policy read the payout lines, or choose by name? Teacher-forced, prompt by prompt.

    python -m experiments.bandit_reading RECIPE RUN_DIR [--label L] [TRAIN.PY FLAGS ...]
    # e.g. experiments/recipes/smollm2-cpu-bandit-pairs-mirror.yaml runs/smollm2-bandit-pairs-mirror

RECIPE and FLAGS are the run's own (`train.py --config RECIPE FLAGS`), resolved by train.py's parser:
they give the env's kwargs, the episode settings and the answer format.

With payouts shown, the two prompts of a name pair differ only in which name the "with probability"
line belongs to. For every pair of the recipe's training env and BanditTest's Tiger / Crane, and
for each side of it (which name is risky), the model's probability of the better arm's answer,
normalised over the two answers as the recipe's warm start writes them (`<answer> NAME</answer>`
with `warm_start_space_before_answer`, else `<answer>NAME</answer>`); `mass` is the probability of
either answer at all. The prompt is the one the rollout engine renders for that seed (system prompt,
instructions, budgets, chat template), checked token for token in tests/test_experiments.py.

`reading` per pair = P(first name | first risky) - P(first name | second risky): 1 follows the payout
lines, 0 gives the same name whatever they say (choosing by name), -1 reads them backwards. A sampled
success rate cannot tell these apart: a policy that always answers Tiger scores 0.5 on BanditTest.
Printed as a table and stored in experiments/results.json ("real_model" -> "reading" -> LABEL).
Recipes with `<think>` are refused: the answer would follow reasoning this probe does not sample.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def best_probability(logp_best: float, logp_other: float) -> float:
    """P(best answer), normalised over the two answers: ``e^a / (e^a + e^b)``."""
    return 1.0 / (1.0 + math.exp(logp_other - logp_best))


def reading(p_first_when_first_risky: float, p_first_when_second_risky: float) -> float:
    """1: follows the payout lines; 0: the same name on both prompts; -1: reads them backwards."""
    return p_first_when_first_risky - p_first_when_second_risky


def reply_logprob(model, prompt_ids: list[int], reply_ids: list[int]) -> float:
    """log p(reply | prompt), teacher-forced, summed over the reply's tokens."""
    import torch

    ids = torch.tensor([prompt_ids + reply_ids])
    with torch.no_grad():
        logps = model(ids).logits[0, len(prompt_ids) - 1 : -1].float().log_softmax(-1)
    return logps.gather(1, torch.tensor(reply_ids)[:, None]).sum().item()


def side_prompts(engine, env_kwargs: dict, pair: tuple[str, str], risky: int) -> tuple[int, list[int], list[str]]:
    """The first seed whose env shows ``pair`` with ``pair[risky]`` risky, the engine's first prompt
    for it, and the env's action names in order."""
    from envs.bandit import BanditEnv
    from starpo_trl.rollout.prompting import first_user_message

    kwargs = {k: v for k, v in env_kwargs.items() if k not in ("arm_names", "mirror_seeds")}
    env, cfg = BanditEnv(arm_names=pair, **kwargs), engine.config
    for seed in range(1000):
        obs, _ = env.reset(seed=seed)
        if env.risky == risky:
            content = first_user_message(
                env, obs, cfg.max_actions_per_turn, cfg.max_turns, cfg.enable_think, cfg.format_instruction
            )
            return seed, engine.chat.prompt_ids(content), list(env.action_names)
    raise RuntimeError(f"no seed below 1000 makes {pair[risky]} risky")  # 1 in 2 per seed: never


def probe(model, engine, env_kwargs: dict, pairs: list[tuple[str, str]], space_before_answer: bool) -> list[dict]:
    """One row per pair: P(best) on each side, the answers' mass, and ``reading``."""
    from starpo_trl.warm_start import expert_reply

    tok = engine.tokenizer
    # the prompt already ends with the reply prefix (if any): the scored answer goes on from there
    prefix = engine.config.prefix_text()
    rows = []
    for pair in pairs:
        sides = []
        for risky in (0, 1):
            _, prompt, names = side_prompts(engine, env_kwargs, pair, risky)
            logps = [
                reply_logprob(
                    model,
                    prompt,
                    tok(expert_reply([n], False, space_before_answer)[len(prefix) :], add_special_tokens=False)[
                        "input_ids"
                    ],
                )
                for n in names
            ]
            sides.append((best_probability(logps[risky], logps[1 - risky]), sum(math.exp(x) for x in logps)))
        p_first = [sides[0][0], 1.0 - sides[1][0]]  # P(first name) when it is risky, when the second is
        rows.append(
            {
                "pair": list(pair),
                "p_best": [round(sides[0][0], 4), round(sides[1][0], 4)],
                "mass": [round(sides[0][1], 4), round(sides[1][1], 4)],
                "reading": round(reading(*p_first), 4),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| pair | P(best), first risky | P(best), second risky | reading | answer mass |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = r["pair"]
        lines.append(
            f"| {a} / {b} | {r['p_best'][0]:.2f} | {r['p_best'][1]:.2f} | {r['reading']:+.2f} | {min(r['mass']):.2f} |"
        )
    return "\n".join(lines)


def probed_pairs(env_id: str, env_kwargs: dict) -> tuple[dict, list[tuple[str, str]]]:
    """The recipe's env kwargs as training builds the env (the registry's, then the recipe's) and the pairs
    to probe: the held-out Tiger / Crane first, then the env's own training pairs (``arm_names`` read by the
    env itself: one pair or a list of pairs)."""
    import gymnasium

    from envs.bandit import TEST_ARMS

    env = gymnasium.make(env_id, **env_kwargs).unwrapped  # as real_model.reads_payouts builds it
    pairs = [tuple(pair) for pair in env.pairs]
    return dict(env.spec.kwargs), [TEST_ARMS] + [pair for pair in pairs if pair != TEST_ARMS]


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe")
    p.add_argument("run_dir", help="a saved model directory (or a Hub id / the base model's cache)")
    p.add_argument("--label", help="the results.json key (default: RUN_DIR)")
    args, flags = p.parse_known_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import train
    from envs.bandit import TEST_ARMS
    from experiments import report
    from starpo_trl.config import rollout_config
    from starpo_trl.models import eos_token_ids
    from starpo_trl.rollout.engine import RolloutEngine

    run_args, cfg, _, _ = train.parser().parse_args_and_config(args=["--config", args.recipe, *flags])
    if cfg.enable_think:
        p.error(f"{args.recipe} asks for <think>: this probe scores bare answers only")
    env_kwargs, pairs = probed_pairs(cfg.env_id, cfg.env_kwargs)
    if len(pairs) < 2:
        p.error(f"{args.recipe} trains on {TEST_ARMS} only: the probe compares them with the training pairs")
    path = str(pathlib.Path(args.run_dir).expanduser())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = RolloutEngine(
        tokenizer, None, rollout_config(cfg), eos_token_ids(tokenizer, model.generation_config.eos_token_id)
    )
    rows = probe(model, engine, env_kwargs, pairs, run_args.warm_start_space_before_answer)
    print(table(rows))
    train_rows = rows[1:]
    result = {
        "provenance": report.provenance(None),
        "recipe": args.recipe,
        "flags": " ".join(flags),
        "pairs": rows,
        "test_reading": rows[0]["reading"],
        "train_reading_mean": round(sum(r["reading"] for r in train_rows) / len(train_rows), 4),
    }
    section = dict(report.load().get("real_model", {}))
    section["reading"] = {**section.get("reading", {}), args.label or args.run_dir: result}
    report.store_real_model(section, None)
    print(
        f"reading: test pair {result['test_reading']:+.2f}, training pairs (mean) {result['train_reading_mean']:+.2f}"
    )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
