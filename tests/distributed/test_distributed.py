"""Two processes on CPU through `accelerate launch`: filtering on the gathered batch, identical weights."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml
from accelerate.commands.config.config_args import load_config_from_file
from helpers import LAUNCH_TIMEOUT_S, TINY_LORA_FLAGS

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))
# GAE with a full critic, as the 2-process critic tests train it
FULL_CRITIC = ["--advantage_estimator", "gae", "--critic_type", "full", "--critic_learning_rate", "0.003"]
# the 2-process Bandit runs start from this warm start, so that rewards differ within groups
WARM_START = {"warm_start_episodes": 1200, "warm_start_epochs": 2, "warm_start_noise": 0.5, "num_start_states": 4}


@pytest.fixture(scope="session")
def warm_bandit(tmp_path_factory, worker_id):
    """The CPU demo's tiny model warm-started on Bandit (WARM_START), built once per test session and shared by
    the pytest-xdist workers (the first builds it under a file lock), so that each 2-process launch does not
    repeat the same SFT in both of its processes."""
    from filelock import FileLock

    from experiments.learning import warm_started  # the recipe's warm start, saved once

    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent  # the parent is this session's, shared by its workers
    path = root / "warm-bandit"
    with FileLock(str(root / "warm-bandit.lock")):
        warm_started("demo-cpu-bandit.yaml", path, **WARM_START)
    return path


def _launch(out, port, *extra, model=None, config=ROOT / "accelerate_configs/cpu_2proc.yaml", sharded=False):
    """train.py on the CPU Bandit demo recipe in 2 processes, from ``model`` (a saved warm start, see
    warm_bandit) or the untrained tiny model; no warm start inside the launch. Returns each rank's summary."""
    # DeepSpeed and FSDP on CPU processes go through tests/sharded_cpu.py (accelerate starts them only on accelerators)
    script = (
        [str(ROOT / "tests/distributed/sharded_cpu.py"), str(ROOT / "train.py"), "--use_cpu", "false"]
        if sharded
        else [str(ROOT / "train.py")]
    )
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(port),
        *script,
        "--config",
        str(ROOT / "recipes/demo-cpu-bandit.yaml"),
        *(["--model_name_or_path", str(model)] if model else []),
        "--warm_start_episodes",
        "0",
        "--num_start_states",
        "4",
        "--num_generations",
        "4",
        "--per_device_train_batch_size",
        "2",
        "--gradient_accumulation_steps",
        "4",
        "--rollout_filter_ratio",
        "0.5",
        "--temperature",
        "1.5",
        "--learning_rate",
        "0.001",
        "--num_eval_episodes",
        "4",
        "--eval_before",
        "false",
        "--output_dir",
        str(out),
        "--report_path",
        "",
        "--rank_summary",
        "true",
        "--disable_tqdm",
        "true",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]


def test_every_accelerate_config_loads():
    names = {c.name for c in CONFIGS}
    assert {
        "single_gpu.yaml",
        "multi_gpu.yaml",
        "zero2.yaml",
        "zero3.yaml",
        "zero3_offload.yaml",
        "fsdp2.yaml",
        "cpu_2proc.yaml",
    } <= names
    for path in CONFIGS:
        config = load_config_from_file(str(path))  # raises on unknown keys
        raw = yaml.safe_load(path.read_text())
        assert config.distributed_type.value == raw["distributed_type"], path.name
    zero3 = load_config_from_file(str(ROOT / "accelerate_configs/zero3_offload.yaml")).deepspeed_config
    assert zero3["zero_stage"] == 3 and zero3["offload_param_device"] == "cpu"
    assert load_config_from_file(str(ROOT / "accelerate_configs/fsdp2.yaml")).fsdp_config["fsdp_version"] == 2


def test_two_cpu_processes_agree_on_kept_groups_and_weights(tmp_path, warm_bandit):
    out = tmp_path / "run"
    ranks = _launch(out, 29533, "--num_eval_episodes", "8", "--max_steps", "2", model=warm_bandit)
    assert [r["num_processes"] for r in ranks] == [2, 2] and ranks[0]["global_step"] == 2
    # the filter saw all 4 groups (both processes' episodes) and kept the top half by std, the same on both ranks
    assert ranks[0]["kept_groups"] == ranks[1]["kept_groups"]
    for rollout in ranks[0]["kept_groups"]:
        stds = rollout["group_std"]
        assert len(stds) == 4
        top = sorted(sorted(range(4), key=lambda g: -stds[g])[:2])  # stable sort: ties keep the earlier group
        assert rollout["kept"] == top
    assert any(len(set(r["group_std"])) > 1 for r in ranks[0]["kept_groups"]), (
        "rewards never differed: the check is vacuous"
    )
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    history = json.loads((out / "report.json").read_text())["log_history"]
    assert any(row.get("grad_norm", 0) > 0 for row in history)  # the policy was updated


def test_two_cpu_processes_train_save_and_resume_the_critic(tmp_path, warm_bandit):
    """GAE with a full critic on 2 processes: the critic moves, stays bit-identical across ranks (its AdamW
    state is sharded between them), is saved whole in the checkpoint, and a 2-process resume continues.
    The filter is RAGEN's current one (reward variance, linear top_p 0.9, zero groups dropped), whose kept count
    varies by step: both ranks keep what the rule gives on the gathered batch, each pads its share."""
    import torch
    from safetensors.torch import load_file

    from starpo_trl.algorithms.filters import select_groups

    out = tmp_path / "run"
    varying_filter = [
        "--rollout_filter_strategy",
        "top_p",
        "--rollout_filter_ratio",
        "0.9",
        "--rollout_filter_metric",
        "reward_variance",
        "--rollout_filter_include_zero",
        "false",
    ]
    critic = [
        *FULL_CRITIC,
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
    ]
    ranks = _launch(out, 29535, *critic, *varying_filter, "--max_steps", "2", model=warm_bandit)
    assert ranks[0]["global_step"] == 2 and ranks[0]["kept_groups"] == ranks[1]["kept_groups"]
    for rollout in ranks[0]["kept_groups"]:
        std = torch.tensor([float("nan") if x < 0 else x for x in rollout["group_std"]])
        expected = select_groups(std, "top_p", 0.9, include_zero=False)  # reward_variance ranks by std, as RAGEN
        assert rollout["kept"] == sorted(expected.tolist())
    assert any(rollout["kept"] for rollout in ranks[0]["kept_groups"]), "nothing kept: the check is vacuous"
    _assert_ranks_agree_and_the_critic_learned(ranks, out)
    saved = out / "checkpoint-2" / "value_model"
    state = torch.load(saved / "critic_optimizer.pt", weights_only=True)
    assert len(state["state"]) == len(load_file(saved / "critic.safetensors"))  # both shards' moments, gathered
    # resume on 2 processes from the checkpoint (the sharded optimizer loads its share of the gathered state),
    # with the paper's fixed-count filter: a step that keeps nothing would leave the critic as it was
    resumed = _launch(
        out,
        29537,
        *critic,
        "--max_steps",
        "3",
        "--resume_from_checkpoint",
        str(out / "checkpoint-2"),
        model=warm_bandit,
    )
    assert resumed[0]["global_step"] == 3 and len(resumed[0]["kept_groups"]) == 1
    assert resumed[0]["critic_sha256"] == resumed[1]["critic_sha256"] != ranks[0]["critic_sha256"]
    assert resumed[0]["weights_sha256"] == resumed[1]["weights_sha256"]
    # the critic came back from the checkpoint: a fresh one (zero head) would predict exactly 0 at step 3
    step3 = [
        row
        for row in json.loads((out / "report.json").read_text())["log_history"]
        if row.get("step") == 3 and "values/std" in row
    ]
    assert step3 and step3[-1]["values/std"] > 0


def test_two_cpu_processes_train_a_lora_critic_in_step(tmp_path, warm_bandit):
    """The LoRA critic (a second adapter inside the DDP-wrapped policy, updated outside DDP) starts, moves and ends
    bit-identical on both ranks."""
    out = tmp_path / "run"
    ranks = _launch(
        out,
        29539,
        "--advantage_estimator",
        "gae",
        "--critic_type",
        "lora",
        *TINY_LORA_FLAGS,
        "--critic_learning_rate",
        "0.003",
        "--max_steps",
        "2",
        model=warm_bandit,
    )
    assert ranks[0]["critic_initial_sha256"] == ranks[1]["critic_initial_sha256"]
    assert ranks[0]["critic_sha256"] == ranks[1]["critic_sha256"] != ranks[0]["critic_initial_sha256"]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]


def test_two_cpu_processes_train_turn_rows_with_a_critic(tmp_path):
    """A context window (one training row per turn: row counts differ between the processes, each pads its
    share to the same count) with GAE on FrozenLake: both ranks end with the same policy and critic, the
    critic moved, and every step trained on turn rows."""
    out = tmp_path / "run"
    ranks = _launch(
        out,
        29539,
        "--env_id",
        "starpo/FrozenLake-v0",
        "--env_kwargs",
        '{"is_slippery": false}',
        # the untrained model (no warm start): its format penalties give the critic returns
        "--max_turns",
        "3",
        "--max_actions_per_turn",
        "1",
        "--context_window",
        "window:1",
        *FULL_CRITIC,
        "--max_steps",
        "2",
    )
    assert ranks[0]["global_step"] == 2
    _assert_ranks_agree_and_the_critic_learned(ranks, out)
    history = json.loads((out / "report.json").read_text())["log_history"]
    turns = [row["env/FrozenLake-v0/turns"] for row in history if "env/FrozenLake-v0/turns" in row]
    assert turns and max(turns) > 1  # several turns: several rows per episode


def _assert_ranks_agree_and_the_critic_learned(ranks, out):
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    assert ranks[0]["critic_sha256"] == ranks[1]["critic_sha256"] != ranks[0]["critic_initial_sha256"]
    history = json.loads((out / "report.json").read_text())["log_history"]
    assert any(row.get("critic/value_grad_norm", 0) > 0 for row in history)


def _cpu_config(tmp_path, name):
    """A shipped accelerate config on 2 CPU processes in full precision."""
    config = yaml.safe_load((ROOT / f"accelerate_configs/{name}.yaml").read_text())
    config.update(num_processes=2, mixed_precision="no", main_process_ip="127.0.0.1")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _zero_config(tmp_path, stage):
    return _cpu_config(tmp_path, f"zero{stage}")


def test_zero3_shards_the_critic_with_the_policy_saves_and_resumes(tmp_path):
    """GAE under DeepSpeed ZeRO-3 (the shipped zero3.yaml, 2 CPU processes): the critic gets its own ZeRO-3
    engine, each process holds half of its weights, ranks agree, the checkpoint holds the whole critic plus
    each process's optimizer shard, and a resumed run restores that critic exactly."""
    from safetensors.torch import load_file

    from starpo_trl.models import weights_digest

    out = tmp_path / "run"
    config = _zero_config(tmp_path, 3)
    critic = [
        "--advantage_estimator",
        "gae",
        "--critic_learning_rate",
        "0.003",
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
    ]  # the untrained model: no warm start under DeepSpeed (train.py refuses it)
    ranks = _launch(out, 29543, *critic, "--max_steps", "2", config=config, sharded=True)
    assert [r["num_processes"] for r in ranks] == [2, 2] and ranks[0]["global_step"] == 2
    total = ranks[0]["critic_numel"]
    for r in ranks:  # half each (+ padding of the partitions)
        assert total / 2 <= r["critic_local_numel"] <= total / 2 + 256
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]  # gathered from the ZeRO-3 shards
    assert ranks[0]["critic_sha256"] == ranks[1]["critic_sha256"] != ranks[0]["critic_initial_sha256"]
    history = json.loads((out / "report.json").read_text())["log_history"]
    assert any(row.get("critic/value_grad_norm", 0) > 0 for row in history)
    saved = out / "checkpoint-1" / "value_model"
    shards = sorted(p.name for p in (saved / "engine").iterdir() if "optim_states" in p.name)
    assert len(shards) == 2, shards  # one optimizer shard per process
    at_step1 = weights_digest([t for _, t in sorted(load_file(saved / "critic.safetensors").items())])
    assert at_step1 not in (ranks[0]["critic_initial_sha256"], ranks[0]["critic_sha256"])
    # resume from step 1 (policy, critic and its optimizer shards, RNG states): step 2 again, bit for bit
    resumed = _launch(
        tmp_path / "resumed",
        29545,
        *critic,
        "--max_steps",
        "2",
        "--resume_from_checkpoint",
        str(out / "checkpoint-1"),
        config=config,
        sharded=True,
    )
    assert resumed[0]["critic_initial_sha256"] != at_step1  # before resuming: a fresh critic
    assert resumed[0]["critic_sha256"] == resumed[1]["critic_sha256"] == ranks[0]["critic_sha256"]
    assert resumed[0]["weights_sha256"] == ranks[0]["weights_sha256"]


def test_zero2_trains_a_lora_critic_in_step(tmp_path):
    """Under the shipped zero2.yaml the LoRA critic (a second adapter inside the policy's DeepSpeed engine,
    with its own sharded AdamW) starts, moves and ends bit-identical on both ranks."""
    out = tmp_path / "run"
    ranks = _launch(
        out,
        29547,
        "--advantage_estimator",
        "gae",
        "--critic_type",
        "lora",
        *TINY_LORA_FLAGS,
        "--critic_learning_rate",
        "0.003",
        "--max_steps",
        "2",
        config=_zero_config(tmp_path, 2),
        sharded=True,
    )
    assert [r["num_processes"] for r in ranks] == [2, 2] and ranks[0]["global_step"] == 2
    assert ranks[0]["critic_initial_sha256"] == ranks[1]["critic_initial_sha256"]
    assert ranks[0]["critic_sha256"] == ranks[1]["critic_sha256"] != ranks[0]["critic_initial_sha256"]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]


def test_fsdp2_shards_the_critic_with_the_policy_saves_and_resumes(tmp_path):
    """GAE under the shipped fsdp2.yaml (2 CPU processes): Accelerate shards the critic as it shards the policy,
    each process holds half of it, ranks agree, the checkpoint holds the whole critic and its whole AdamW state,
    and a resumed run repeats step 2 bit for bit."""
    out = tmp_path / "run"
    config = _cpu_config(tmp_path, "fsdp2")
    critic = [
        "--advantage_estimator",
        "gae",
        "--critic_learning_rate",
        "0.003",
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
    ]
    ranks = _launch(out, 29549, *critic, "--max_steps", "2", config=config, sharded=True)
    assert [r["num_processes"] for r in ranks] == [2, 2] and ranks[0]["global_step"] == 2
    assert ranks[0]["critic_local_numel"] + ranks[1]["critic_local_numel"] == ranks[0]["critic_numel"]
    assert ranks[0]["critic_local_numel"] < 0.55 * ranks[0]["critic_numel"]
    _assert_ranks_agree_and_the_critic_learned(ranks, out)
    saved = out / "checkpoint-1" / "value_model"
    import torch
    from safetensors.torch import load_file

    state = torch.load(saved / "critic_optimizer.pt", weights_only=True)
    assert len(state["state"]) == len(load_file(saved / "critic.safetensors"))  # every parameter's moments, gathered
    resumed = _launch(
        tmp_path / "resumed",
        29551,
        *critic,
        "--max_steps",
        "2",
        "--resume_from_checkpoint",
        str(out / "checkpoint-1"),
        config=config,
        sharded=True,
    )
    assert resumed[0]["critic_sha256"] == resumed[1]["critic_sha256"] == ranks[0]["critic_sha256"]
    assert resumed[0]["weights_sha256"] == ranks[0]["weights_sha256"]
