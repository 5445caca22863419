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
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "accelerate_configs/cpu_2proc.yaml"),
        "--main_process_port", "29533", str(ROOT / "train.py"), "--config", str(ROOT / "recipes/demo-cpu-bandit.yaml"),
        "--warm_start_episodes", "1200", "--warm_start_epochs", "2", "--warm_start_noise", "0.5",
        "--max_steps", "2", "--num_start_states", "4", "--num_generations", "4", "--per_device_train_batch_size", "2",
        "--gradient_accumulation_steps", "4", "--rollout_filter_ratio", "0.5", "--temperature", "1.5", "--learning_rate", "0.001",
        "--num_eval_episodes", "8", "--eval_before", "false", "--output_dir", str(out), "--report_path", "", "--rank_summary", "true",
        "--disable_tqdm", "true",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
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
