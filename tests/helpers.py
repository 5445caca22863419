"""Shared test helpers."""

import json
import os
import pathlib
import subprocess
import sys

from starpo_trl import StarPOConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]

# a ceiling for a multi-process launch: generous, since a busy 2-core machine runs it several times slower
LAUNCH_TIMEOUT_S = 1200

# a small LoRA on the tiny model, as train.py flags
TINY_LORA_FLAGS = ["--use_peft", "true", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"]


def make_args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        env_id="starpo/Bandit-v0",
        num_start_states=4,
        num_generations=4,
        rollout_filter_ratio=0.5,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        max_steps=2,
        max_turns=1,
        max_tokens_per_turn=12,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        num_eval_episodes=8,
        seed=0,
    )
    base.update(kw)
    return StarPOConfig(**base)


# the zero-advantage skip after real updates (tests/monitoring/test_empty_steps.py, on 1 and 2 processes): two
# rollouts where every other episode writes no answer (advantages not 0), with weight decay, then one where every
# episode names Dragon (every advantage 0)
ZERO_ADVANTAGE_AFTER_UPDATES = dict(
    max_steps=3, weight_decay=0.1, entropy_coef=0.05, skip_zero_advantage_steps=True, rollout_filter_ratio=1.0
)


def zero_advantage_after_updates_reply(call: int, i: int) -> str:
    """The scripted reply of generate call ``call`` (one per rollout: one turn), row ``i``."""
    return "no answer here" if call < 2 and i % 2 else "<think>x</think><answer>Dragon</answer>"


def filter_settings(**kw):
    """The rollout filter's settings as StarPOConfig's defaults have them (every ``rollout_filter_*``
    field), with ``kw`` on top: for the pure scoring functions, which read only these."""
    import dataclasses
    from types import SimpleNamespace

    base = {f.name: f.default for f in dataclasses.fields(StarPOConfig) if f.name.startswith("rollout_filter_")}
    return SimpleNamespace(**{**base, **kw})


def run_two_processes(script: str, out, port: int, *args: str) -> list[dict]:
    """``tests/distributed/<script> out *args`` under torchrun in 2 CPU processes (gloo); each rank's
    ``rank-N.json`` from ``out``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    cmd += [str(ROOT / "tests/distributed" / script), str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((pathlib.Path(out) / f"rank-{r}.json").read_text()) for r in (0, 1)]
