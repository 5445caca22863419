"""Two processes on CPU through `accelerate launch`: filtering on the gathered batch, identical weights."""

import json
import os
import pathlib
import subprocess
import sys

import yaml
from accelerate.commands.config.config_args import load_config_from_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))


def _launch(out, port, *extra):
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "accelerate_configs/cpu_2proc.yaml"),
        "--main_process_port", str(port), str(ROOT / "train.py"), "--config", str(ROOT / "recipes/demo-cpu-bandit.yaml"),
        "--warm_start_episodes", "600", "--warm_start_epochs", "1", "--warm_start_noise", "0.5",
        "--num_start_states", "4", "--num_generations", "4", "--per_device_train_batch_size", "2",
        "--gradient_accumulation_steps", "4", "--rollout_filter_ratio", "0.5", "--temperature", "1.5", "--learning_rate", "0.001",
        "--num_eval_episodes", "4", "--eval_before", "false", "--output_dir", str(out), "--report_path", "", "--rank_summary", "true",
        "--disable_tqdm", "true", *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]


def test_every_accelerate_config_loads():
    names = {c.name for c in CONFIGS}
    assert {"single_gpu.yaml", "multi_gpu.yaml", "zero2.yaml", "zero3.yaml", "zero3_offload.yaml", "fsdp2.yaml", "cpu_2proc.yaml"} <= names
    for path in CONFIGS:
        config = load_config_from_file(str(path))  # raises on unknown keys
        raw = yaml.safe_load(path.read_text())
        assert config.distributed_type.value == raw["distributed_type"], path.name
    zero3 = load_config_from_file(str(ROOT / "accelerate_configs/zero3_offload.yaml")).deepspeed_config
    assert zero3["zero_stage"] == 3 and zero3["offload_param_device"] == "cpu"
    assert load_config_from_file(str(ROOT / "accelerate_configs/fsdp2.yaml")).fsdp_config["fsdp_version"] == 2


def test_two_cpu_processes_agree_on_kept_groups_and_weights(tmp_path):
    out = tmp_path / "run"
    # later flags win: a longer warm start than _launch's, so that rewards differ within groups
    ranks = _launch(out, 29533, "--warm_start_episodes", "1200", "--warm_start_epochs", "2", "--num_eval_episodes", "8", "--max_steps", "2")
    assert [r["num_processes"] for r in ranks] == [2, 2] and ranks[0]["global_step"] == 2
    # the filter saw all 4 groups (both processes' episodes) and kept the top half by std, the same on both ranks
    assert ranks[0]["kept_groups"] == ranks[1]["kept_groups"]
    for rollout in ranks[0]["kept_groups"]:
        stds = rollout["group_std"]
        assert len(stds) == 4
        top = sorted(sorted(range(4), key=lambda g: -stds[g])[:2])  # stable sort: ties keep the earlier group
        assert rollout["kept"] == top
    assert any(len(set(r["group_std"])) > 1 for r in ranks[0]["kept_groups"]), "rewards never differed: the check is vacuous"
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    history = json.loads((out / "report.json").read_text())["log_history"]
    assert any(row.get("grad_norm", 0) > 0 for row in history)  # the policy was updated


def test_two_cpu_processes_train_save_and_resume_the_critic(tmp_path):
    """GAE with a full critic on 2 processes: the critic moves, stays bit-identical across ranks (its AdamW
    state is sharded between them), is saved whole in the checkpoint, and a 2-process resume continues."""
    from safetensors.torch import load_file
    import torch

    out = tmp_path / "run"
    critic = ["--advantage_estimator", "gae", "--critic_type", "full", "--critic_learning_rate", "0.003", "--save_strategy", "steps", "--save_steps", "2"]
    ranks = _launch(out, 29535, *critic, "--max_steps", "2")
    assert ranks[0]["global_step"] == 2 and ranks[0]["kept_groups"] == ranks[1]["kept_groups"]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    assert ranks[0]["critic_sha256"] == ranks[1]["critic_sha256"] != ranks[0]["critic_initial_sha256"]
    history = json.loads((out / "report.json").read_text())["log_history"]
    assert any(row.get("critic/value_grad_norm", 0) > 0 for row in history)
    saved = out / "checkpoint-2" / "value_model"
    state = torch.load(saved / "critic_optimizer.pt", weights_only=True)
    assert len(state["state"]) == len(load_file(saved / "critic.safetensors"))  # both shards' moments, gathered
    # resume on 2 processes from the checkpoint (the sharded optimizer loads its share of the gathered state)
    resumed = _launch(out, 29537, *critic, "--max_steps", "3", "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert resumed[0]["global_step"] == 3 and len(resumed[0]["kept_groups"]) == 1
    assert resumed[0]["critic_sha256"] == resumed[1]["critic_sha256"] != ranks[0]["critic_sha256"]
    assert resumed[0]["weights_sha256"] == resumed[1]["weights_sha256"]
    # the critic came back from the checkpoint: a fresh one (zero head) would predict exactly 0 at step 3
    step3 = [row for row in json.loads((out / "report.json").read_text())["log_history"] if row.get("step") == 3 and "values/std" in row]
    assert step3 and step3[-1]["values/std"] > 0


def test_two_cpu_processes_train_a_lora_critic_in_step(tmp_path):
    """The LoRA critic (a second adapter inside the DDP-wrapped policy, updated outside DDP) starts, moves and ends
    bit-identical on both ranks."""
    out = tmp_path / "run"
    ranks = _launch(
        out, 29539, "--advantage_estimator", "gae", "--critic_type", "lora", "--use_peft", "true", "--lora_r", "4",
        "--lora_target_modules", "q_proj", "v_proj", "--critic_learning_rate", "0.003", "--max_steps", "2",
    )
    assert ranks[0]["critic_initial_sha256"] == ranks[1]["critic_initial_sha256"]
    assert ranks[0]["critic_sha256"] == ranks[1]["critic_sha256"] != ranks[0]["critic_initial_sha256"]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
