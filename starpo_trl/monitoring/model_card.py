"""The model card written next to a trained model (and pushed with it by ``push_to_hub``).

It records what a reader needs to trust or reproduce the model: the base model, the environment
and its kwargs, the StarPO settings that matter, every episode setting, the held-out evaluation table (the metrics
``evaluate.py`` prints), and the recipe the run was launched with.
"""

from __future__ import annotations

import os
from dataclasses import fields

from huggingface_hub import ModelCard, ModelCardData

from envs.contract import env_name
from starpo_trl.rollout.settings import RolloutSettings

# (field, label) of the training settings shown in the card (the episode settings: every RolloutSettings field)
SETTINGS = (
    ("advantage_estimator", "advantage estimator"),
    ("scale_rewards", "advantages scaled by (group / batch std, or none)"),
    ("skip_zero_advantage_steps", "no update when every advantage is 0"),
    ("rollout_filter_metric", "rollout filter: group score"),
    ("rollout_filter_strategy", "rollout filter: strategy"),
    ("rollout_filter_ratio", "rollout filter: value (top_k share, top_k_abs count, top_p p, min_p fraction)"),
    ("rollout_filter_include_zero", "rollout filter: keeps zero-score groups"),
    ("rollout_filter_refill", "rollout filter: more start states while too few groups are kept"),
    ("num_start_states", "start states (groups) per step"),
    ("num_generations", "rollouts per start state"),
    ("epsilon", "clip low"),
    ("epsilon_high", "clip high"),
    ("beta", "KL coefficient"),
    ("entropy_coef", "entropy bonus"),
    ("loss_type", "TRL loss type"),
    ("learning_rate", "learning rate"),
    ("max_steps", "steps"),
    ("temperature", "rollout temperature"),
    ("seed", "seed"),
)
# metrics of the evaluation table, in order; others are appended
EVAL_ORDER = (
    "success",
    "pass@1",
    "reward_mean",
    "valid_action_rate",
    "effective_action_rate",
    "format_error_rate",
    "turns",
    "actions",
    "truncated",
    "env_errors",
)

CITATION = """@article{wang2025ragen,
  title   = {RAGEN: Understanding Self-Evolution in LLM Agents via Multi-Turn Reinforcement Learning},
  author  = {Wang, Zihan and others},
  journal = {arXiv preprint arXiv:2504.20073},
  year    = {2025}
}"""


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def evaluation_table(results: dict[str, dict]) -> str:
    """Markdown table: one column per evaluation (e.g. "before RL", "after RL"), one row per metric."""
    if not results:
        return "_No held-out evaluation was run._"
    names = list(results)
    keys = [k for k in EVAL_ORDER if any(k in r for r in results.values())]
    keys += sorted({k for r in results.values() for k in r} - set(keys) - {"env_id"})
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    several = any("/" in k for r in results.values() for k in r)  # per-env rows: the others are pooled
    for key in keys:
        label = f"{key} (all envs pooled)" if several and "/" not in key else key
        lines.append(
            f"| {label} | " + " | ".join(_fmt(results[n][key]) if key in results[n] else "" for n in names) + " |"
        )
    return "\n".join(lines)


def render_model_card(
    args,
    base_model: str | None,
    evaluation: dict[str, dict] | None = None,
    recipe: str | None = None,
    model_id: str | None = None,
    adapter: bool = False,
) -> ModelCard:
    """A ``huggingface_hub.ModelCard`` for a model trained with ``MultiTurnStarPOTrainer`` and ``args``
    (``adapter``: the saved weights are a PEFT adapter on ``base_model``). Longer than 60 lines on purpose:
    the card's text as one template, read top to bottom."""
    trained = args.train_envs()
    ids = list(dict.fromkeys(e.env_id for e in trained))  # each env id once, in order
    data = ModelCardData(
        base_model=base_model,
        library_name="peft" if adapter else "transformers",
        pipeline_tag="text-generation",
        tags=["starpo-trl", "trl", "reinforcement-learning", "multi-turn", "agent"] + [env_name(i) for i in ids],
    )
    settings = "\n".join(
        f"| {label} | `{_fmt(getattr(args, name))}` |" for name, label in SETTINGS if hasattr(args, name)
    )
    helps = {f.name: f.metadata.get("help", "") for f in fields(RolloutSettings)}
    episode = "\n".join(
        f"| `{name}` | `{_fmt(value)}` | {helps[name]} |" for name, value in RolloutSettings.of(args).values().items()
    )
    if len(trained) == 1:
        train_line = f"- train env: `{trained[0].env_id}`, kwargs `{trained[0].env_kwargs}`"
    else:
        train_line = "- train envs: " + "; ".join(
            f"`{e.env_id}`, kwargs `{e.env_kwargs}`" + (f", n_groups {e.n_groups}" if e.n_groups else "")
            for e in trained
        )
    held_out = args.eval_envs()
    if len(held_out) == 1:
        eval_line = f"- evaluation env: `{held_out[0].env_id}`, kwargs `{held_out[0].env_kwargs}`"
    else:
        eval_line = "- evaluation envs (one row each below, and all pooled): " + "; ".join(
            f"`{e.env_id}`, kwargs `{e.env_kwargs}`" for e in held_out
        )
    lines = [
        "---",
        data.to_yaml(),
        "---",
        "",
        f"# {model_id or ' + '.join(env_name(i) for i in ids) + ' agent'}",
        "",
        "A multi-turn agent for "
        + ", ".join(f"`{i}`" for i in ids)
        + (f", trained from [{base_model}](https://huggingface.co/{base_model})" if base_model else "")
        + " with StarPO (the multi-turn RL method of RAGEN) using `MultiTurnStarPOTrainer` from starpo-trl, on TRL's `GRPOTrainer`.",
        "",
        "## Environment",
        "",
        train_line,
        f"{eval_line}; {args.num_eval_episodes} held-out seeds from "
        f"{args.eval_seed_offset}, temperature {args.eval_temperature}",
        "",
        "## Held-out evaluation",
        "",
        evaluation_table(evaluation or {}),
        "",
        "Reproduce with `python evaluate.py --model_name_or_path MODEL`: it plays the same held-out seeds with the "
        "same env, kwargs, temperature and budgets, read from `starpo_rollout.json` saved with the model (flags override them).",
        "",
        "## StarPO settings",
        "",
        "| setting | value |",
        "|---|---|",
        settings,
        "",
        "## Episode settings",
        "",
        "Saved with the model in `starpo_rollout.json`; `evaluate.py` plays with them.",
        "",
        "| setting | value | what |",
        "|---|---|---|",
        episode,
        "",
        "## Prompt format",
        "",
        "The model answers every turn with "
        + ("`<think>...</think><answer>...</answer>`" if args.enable_think else "`<answer>...</answer>`")
        + "; several actions in one answer are separated by `||`. Use the chat template saved with the model.",
    ]
    if recipe:
        lines += ["", "## Recipe", "", "```yaml", recipe.rstrip(), "```"]
    lines += ["", "## Citation", "", "```bibtex", CITATION, "```", ""]
    return ModelCard("\n".join(lines))


def write_model_card(
    model, args, evaluation: dict[str, dict], recipe: str | None, model_id: str | None, output_dir: str
) -> None:
    """``render_model_card`` for the trained (unwrapped) ``model``, saved as ``output_dir/README.md``.
    Only a Hub id is linked as the base model (not a local folder, not the offline tiny model)."""
    base = getattr(model.config, "_name_or_path", None) or None
    if base is not None and (os.path.isdir(base) or base == "tiny"):
        base = None
    card = render_model_card(args, base, evaluation, recipe, model_id, adapter=hasattr(model, "peft_config"))
    os.makedirs(output_dir, exist_ok=True)
    card.save(os.path.join(output_dir, "README.md"))
