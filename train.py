"""Train an agent with StarPO / StarPO-S in a text environment.

    accelerate launch train.py --config recipes/sokoban-qwen2.5-0.5b.yaml [--any_field value]
    python train.py --config recipes/demo-cpu-bandit.yaml          # CPU, tiny offline model

Steps: load the model (Hub id, local dir, or ``tiny``), optionally warm-start it by SFT on a
noisy expert's episodes, evaluate on held-out seeds, train with ``MultiTurnStarPOTrainer``,
evaluate again, save (and push if ``push_to_hub``). Writes ``report.json``, ``curves.png`` and
``dashboard.png`` (collapse signals, guard events marked) to ``output_dir``; with
``report_path`` also appends the result to that JSON file.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from trl import ModelConfig, TrlParser, get_peft_config

from starpo_trl import MultiTurnStarPOTrainer, StarPOConfig
from starpo_trl.algorithms import critic_estimators, get_estimator
from starpo_trl.checkpoints import save_model_extras
from starpo_trl.config import RunArguments, rollout_config
from starpo_trl.models import TinyModelArguments, load_model_and_tokenizer, weights_digest
from starpo_trl.monitoring.plotting import plot_curves, plot_dashboard
from starpo_trl.warm_start import check_expert_thought, warm_start_from_config


def append_report(path: str, result: dict, wall_seconds: float) -> None:
    report = {"results": [], "wall_seconds": 0.0}
    if os.path.exists(path):
        with open(path) as f:
            report = json.load(f)
    key = lambda r: r.get("env_id") or r.get("eval_env_ids")  # noqa: E731  (one result per eval env, or set of them)
    report["results"] = [r for r in report["results"] if key(r) != key(result)] + [result]
    report["wall_seconds"] = round(report.get("wall_seconds", 0.0) + wall_seconds, 1)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)


def recipe_text() -> str | None:
    """The ``--config`` YAML this run was launched with, plus the command-line overrides."""
    import sys

    argv = sys.argv[1:]
    if "--config" not in argv:
        return None
    i = argv.index("--config")
    with open(argv[i + 1]) as f:
        text = f.read()
    overrides = argv[:i] + argv[i + 2 :]
    return text + (f"# command-line overrides: {' '.join(overrides)}\n" if overrides else "")


def check_model_source(value: str, name: str) -> None:
    """A local model directory, or a Hub id whose config resolves now (not after a warm start)."""
    if os.path.isdir(value):
        if not os.path.isfile(os.path.join(value, "config.json")):
            raise ValueError(
                f"{name}={value!r} is a directory without config.json: give a saved model directory (save_pretrained)."
            )
        return
    first = value.split("/")[0]
    looks_like_path = value.startswith((".", "/", "~")) or value.count("/") > 1 or (first and os.path.isdir(first))
    if looks_like_path:
        raise ValueError(f"{name}={value!r}: no such model directory. Check the path (it is not a Hub id either).")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(value)
    except Exception as err:  # network, unknown repo, gated: all mean it cannot be used
        raise ValueError(
            f"{name}={value!r} is neither a local model directory nor a loadable Hub model id: {err}"
        ) from None


def check_run(run_args: RunArguments, args: StarPOConfig) -> None:
    """Everything that can be checked before a model loads or a warm start runs."""
    if args.env_id is None:
        raise ValueError("Set env_id, e.g. --env_id starpo/Sokoban-v0")
    if run_args.warm_start_think not in ("action", "state"):
        raise ValueError(f"warm_start_think must be 'action' or 'state', got {run_args.warm_start_think!r}")
    if run_args.warm_start_episodes > 0 and run_args.warm_start_think == "state":
        if not args.enable_think:
            raise ValueError("warm_start_think='state' writes the expert's think: set enable_think=true.")
        for env in args.train_envs():  # each training env must describe its start state
            check_expert_thought(env.env_id, env.env_kwargs, args.train_seed_offset)
    if run_args.critic_init != "policy" and (
        not get_estimator(args.advantage_estimator).critic or args.critic_type != "full"
    ):
        raise ValueError(
            f"critic_init={run_args.critic_init!r} sets the weights of a full critic: use it with critic_type=full and "
            f"advantage_estimator in {critic_estimators()}, or leave critic_init=policy."
        )
    if run_args.critic_init not in ("policy", "pre_warm_start"):
        check_model_source(run_args.critic_init, "critic_init")
    resume = args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "yes", "1"):
        from transformers.trainer_utils import get_last_checkpoint

        last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
        if last is None:
            raise ValueError(
                f"resume_from_checkpoint=true, but {args.output_dir!r} holds no checkpoint-N folder to resume from."
            )
        args.resume_from_checkpoint = last
    elif resume and not os.path.isfile(os.path.join(str(resume), "trainer_state.json")):
        raise ValueError(
            f"resume_from_checkpoint={resume!r} is not a checkpoint folder (no trainer_state.json there)."
        )
    if run_args.report_path:
        if os.path.abspath(run_args.report_path) == os.path.abspath(os.path.join(args.output_dir, "report.json")):
            raise ValueError(
                f"report_path={run_args.report_path!r} is the run's own report (output_dir/report.json, rewritten at the end): "
                "give report_path another file, e.g. one shared by several runs."
            )
        if os.path.exists(run_args.report_path):
            try:
                with open(run_args.report_path) as f:
                    report = json.load(f)
                ok = isinstance(report, dict) and isinstance(report.get("results"), list)
            except (OSError, ValueError):
                ok = False
            if not ok:
                raise ValueError(
                    f"report_path={run_args.report_path!r} exists but is not a report of this script (a JSON object with a "
                    "'results' list): give another path, or remove that file."
                )


def write_rank_summary(trainer, output_dir: str, critic_initial: str | None) -> None:
    """``output_dir/rank-N.json``: what this process holds (kept groups per rollout, SHA-256 of its policy
    and critic weights), to check that the processes agree."""
    acc = trainer.accelerator
    summary = {
        "process_index": acc.process_index,
        "num_processes": acc.num_processes,
        "kept_groups": trainer.kept_group_history,
        "weights_sha256": weights_digest(acc.unwrap_model(trainer.model)),
        "global_step": trainer.state.global_step,
        # parameters of the critic, and the share this process holds (half each on 2 processes under ZeRO-3)
        "critic_numel": None
        if trainer.critic is None
        else sum(getattr(p, "ds_numel", p.numel()) for p in trainer.critic.trainable_parameters()),
        "critic_local_numel": None
        if trainer.critic is None
        else sum(
            p.ds_tensor.numel()
            if hasattr(p, "ds_tensor")
            else p.to_local().numel()
            if hasattr(p, "to_local")
            else p.numel()
            for p in trainer.critic.trainable_parameters()
        ),
        "critic_sha256": None if trainer.critic is None else weights_digest(trainer.critic.trainable_parameters()),
        "critic_initial_sha256": critic_initial,
    }
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, f"rank-{acc.process_index}.json"), "w") as f:
        json.dump(summary, f)


def write_outputs(trainer, run_args: RunArguments, args: StarPOConfig, result: dict, wall: float) -> None:
    """``report.json``, ``curves.png`` and ``dashboard.png`` in ``output_dir``; the result appended to ``report_path``."""
    with open(os.path.join(args.output_dir, "report.json"), "w") as f:
        json.dump({**result, "wall_seconds": round(wall, 1), "log_history": trainer.state.log_history}, f, indent=2)
    envs = [env.name for env in args.train_envs()]  # the names their metrics are logged under
    title = ", ".join(dict.fromkeys(env.env_id for env in args.train_envs()))
    plot_curves(trainer.state.log_history, envs, os.path.join(args.output_dir, "curves.png"), title=title)
    plot_dashboard(
        trainer.state.log_history,
        os.path.join(args.output_dir, "dashboard.png"),
        envs,
        result["guard_events"],
        title=title,
    )
    if run_args.report_path:
        append_report(run_args.report_path, result, wall)
    for line in summary_lines(args, result):
        print(f"{line} on {args.num_eval_episodes} held-out episodes per env ({wall:.0f}s)")


def held_out_result(args: StarPOConfig, before: dict | None, after: dict) -> dict:
    """The held-out success of a run, labelled with what was played. One eval env: ``env_id``,
    ``success_before`` / ``success_after``. Several (``eval_env_configs``): each env's own under
    ``eval_envs`` (by name), and the episodes of all of them together as ``pooled_success_before`` /
    ``pooled_success_after``; ``env_id`` is None and ``eval_env_ids`` lists them."""
    envs = args.eval_envs()
    if len(envs) == 1:
        return {
            "env_id": envs[0].env_id,
            "success_before": None if before is None else before["success"],
            "success_after": after["success"],
        }
    return {
        "env_id": None,
        "eval_env_ids": [env.env_id for env in envs],
        "eval_envs": {
            env.name: {
                "env_id": env.env_id,
                "success_before": None if before is None else before[f"{env.name}/success"],
                "success_after": after[f"{env.name}/success"],
            }
            for env in envs
        },
        "pooled_success_before": None if before is None else before["success"],
        "pooled_success_after": after["success"],
    }


def summary_lines(args: StarPOConfig, result: dict) -> list[str]:
    """One ``env: success before -> after`` line per eval env; with several, then their episodes pooled (said so)."""
    if result["env_id"] is not None:
        return [f"{result['env_id']}: success {result['success_before']} -> {result['success_after']}"]
    lines = [
        f"{e['env_id']}: success {e['success_before']} -> {e['success_after']}" for e in result["eval_envs"].values()
    ]
    return lines + [
        f"all {len(lines)} eval envs pooled: success {result['pooled_success_before']} -> {result['pooled_success_after']}"
    ]


def _launched_with(args: StarPOConfig, backend: str) -> bool:
    """``args.deepspeed`` / ``args.fsdp`` set, or ``accelerate launch`` with such a config (it sets
    ``ACCELERATE_USE_DEEPSPEED`` / ``ACCELERATE_USE_FSDP``)."""
    return (
        bool(getattr(args, backend)) or os.environ.get(f"ACCELERATE_USE_{backend.upper()}", "false").lower() == "true"
    )


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def save_merged_policy(trainer: MultiTurnStarPOTrainer, output_dir: str) -> None:
    """LoRA after a warm start: the warm start trained the whole model and the adapter only what RL added on top,
    so the adapter on the original base is not the trained policy. Save the policy as evaluated instead: the
    warm-started model with the adapter merged in, a full model (also what ``push_to_hub`` uploads; the adapter
    alone is never saved or pushed). A LoRA critic is saved first, to ``value_model/``: merging unloads its adapter."""
    save_model_extras(output_dir, trainer.args, trainer.critic, write=trainer.args.should_save)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    trainer.model = trainer.model_wrapped = policy.merge_and_unload(adapter_names=["default"])
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:  # an adapter left in the folder by an earlier run would load in place of the model
        for name in ADAPTER_FILES:
            path = os.path.join(output_dir, name)
            if os.path.exists(path):
                os.remove(path)
    trainer.save_model(output_dir, _internal_call=True)  # the critic is saved above; main pushes at the end


def check_warm_start(run_args: RunArguments, args: StarPOConfig, model_args: ModelConfig) -> None:
    """The warm start's limits under DeepSpeed and FSDP, checked before any model loads."""
    if run_args.warm_start_episodes > 0 and _launched_with(args, "deepspeed"):
        raise ValueError(
            "The warm start (SFT before RL, for the CPU demos) cannot run under DeepSpeed: a second DeepSpeed Accelerator "
            "cannot be created in one process. Set warm_start_episodes=0, or warm-start separately (e.g. with TRL's SFT "
            "script) and pass that model as model_name_or_path."
        )
    if run_args.warm_start_episodes > 0 and model_args.use_peft and _launched_with(args, "fsdp"):
        raise ValueError(
            "A warm start with LoRA cannot run under FSDP: the warm start trains the whole model, so the saved policy is "
            "the warm-started model with the adapter merged in, and merging needs the unsharded weights. Set "
            "warm_start_episodes=0 and pass a warm-started model as model_name_or_path, or train without FSDP."
        )


def main(run_args: RunArguments, args: StarPOConfig, model_args: ModelConfig, tiny_args: TinyModelArguments) -> dict:
    start = time.time()
    # a home-relative model_name_or_path is expanded where models load (load_model_and_tokenizer)
    if run_args.critic_init.startswith("~"):
        run_args.critic_init = os.path.expanduser(run_args.critic_init)
    if run_args.torch_threads is not None:
        torch.set_num_threads(run_args.torch_threads)
    try:  # everything that can refuse the settings, before training starts
        check_run(run_args, args)
        check_warm_start(run_args, args, model_args)
        model, tokenizer = load_model_and_tokenizer(
            model_args,
            tiny_args,
            seed=args.seed,
            trust_remote_code=args.trust_remote_code,
            rollout=rollout_config(args),
        )
    except ValueError as err:
        raise SettingsError(str(err)) from err
    value_model = None if run_args.critic_init == "policy" else run_args.critic_init
    if run_args.critic_init == "pre_warm_start":
        import copy

        value_model = copy.deepcopy(model)
    if run_args.warm_start_episodes > 0:
        model = warm_start_from_config(model, tokenizer, run_args, args)
    trainer = MultiTurnStarPOTrainer(
        model,
        args,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        value_model=value_model,
        recipe=recipe_text(),
    )
    del value_model  # the critic holds its own copy
    critic_initial = None if trainer.critic is None else weights_digest(trainer.critic.trainable_parameters())
    before = trainer.evaluate_success(name="before RL") if run_args.eval_before else None
    # resuming re-runs the (seeded) warm start first: a LoRA checkpoint holds only the adapter, not the warm-started base
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    after = trainer.evaluate_success(name="after RL")
    if run_args.warm_start_episodes > 0 and model_args.use_peft:
        save_merged_policy(trainer, args.output_dir)
    else:
        trainer.save_model(args.output_dir)
    trainer.create_model_card()
    result = {
        **held_out_result(args, before, after),
        "episodes": args.num_eval_episodes,
        "before": before,
        "after": after,
        "guard_events": trainer.guard.events if trainer.guard is not None else [],
    }
    wall = time.time() - start
    if run_args.rank_summary:
        write_rank_summary(trainer, args.output_dir, critic_initial)
    if trainer.accelerator.is_main_process:
        write_outputs(trainer, run_args, args, result, wall)
    if args.push_to_hub:
        trainer.push_to_hub()
    return result


# Choosing the envs on the command line replaces the recipe's choice: a flag on the left drops the recipe's keys on
# the right (a recipe with env_id runs with --env_configs '[...]' instead, and the other way round).
REPLACES = {
    "env_configs": ("env_id", "env_kwargs"),
    "env_id": ("env_configs",),
    "eval_env_configs": ("eval_env_id", "eval_env_kwargs"),
    "eval_env_id": ("eval_env_configs",),
}


class SettingsError(ValueError):
    """A setting, a recipe or the model's chat template is refused before training starts."""


class RecipeParser(TrlParser):
    """TRL's parser (``--config RECIPE`` gives defaults, flags override them), where an env choice made with a flag
    replaces the recipe's (``REPLACES``)."""

    def parse_args_and_config(self, args=None, *rest, **kwargs):
        given = list(sys.argv[1:] if args is None else args)
        self._flags = {a[2:].split("=")[0] for a in given if a.startswith("--")}
        return super().parse_args_and_config(given, *rest, **kwargs)

    def set_defaults_with_config(self, **config):
        for flag, replaced in REPLACES.items():
            if flag in getattr(self, "_flags", ()):
                for key in replaced:
                    if key not in self._flags:
                        config.pop(key, None)
        return super().set_defaults_with_config(**config)


def parser() -> TrlParser:
    """train.py's flags and recipe keys: ``parser().parse_args_and_config(args=["--config", RECIPE, *FLAGS])``
    gives the settings a run is made with."""
    return RecipeParser((RunArguments, StarPOConfig, ModelConfig, TinyModelArguments))


def end_process_group() -> None:
    """End a multi-process run's process group once every rank has got here (a barrier first); nothing in a single
    process. Left alive at interpreter exit, or torn down while another rank still talks to them, gloo's worker
    threads can abort the process ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def cli(argv: list[str] | None = None) -> dict:
    """The script: parse the flags and the recipe, train, then `end_process_group` (only after a run that finished:
    a rank that raised must not wait on the others)."""
    try:
        parsed = parser().parse_args_and_config(args=argv)
    except ValueError as err:
        raise SettingsError(str(err)) from err
    result = main(*parsed)
    end_process_group()
    return result


def script(argv: list[str] | None = None) -> int:
    """``python train.py``: a refused setting prints one line (``train.py: ...``) and exits with 2; ``--traceback``
    shows the whole traceback instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    show = "--traceback" in argv
    argv = [a for a in argv if a != "--traceback"]
    try:
        cli(argv)
    except SettingsError as err:
        if show:
            raise
        print(f"train.py: {err} (--traceback shows where)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(script())
