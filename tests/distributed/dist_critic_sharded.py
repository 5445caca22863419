"""Run by tests/algorithms/test_critic.py under torchrun (2 CPU processes, gloo): the full critic sharded by
DeepSpeed (argv[2] = ``zero2``, ``zero3``, ``zero3_offload``) or by Accelerate's FSDP2 (``fsdp``).

Each process holds a sharded critic and a plain one (no sharding, gradients averaged by hand),
both from the same policy, and steps both on its own micro-batch. The sharded critic must hold only
its share of the AdamW state (ZeRO-3 and FSDP: of the weights too), match the plain one step for
step, save whole weights that a new sharded critic resumes exactly; under FSDP the files are an
unsharded critic's, which a plain critic loads. Under DeepSpeed a critic from a policy that ZeRO-3
partitioned at load (``zero3_init_flag``) starts from that policy's gathered weights.
Writes ``rank-N.json`` into argv[1].
"""

import json
import os
import sys

mode = sys.argv[2]
if mode == "fsdp":
    os.environ["ACCELERATE_USE_FSDP"] = "true"  # read by tests/sharded_cpu.py
sys.path.insert(0, os.path.dirname(__file__))
import dist_critic  # noqa: E402
import sharded_cpu  # noqa: E402,F401  (DeepSpeed / FSDP on CPU processes)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import train  # noqa: E402
from starpo_trl.algorithms.critic import deepspeed_critic_config, make_critic  # noqa: E402
from starpo_trl.algorithms.value_model import decoder_of  # noqa: E402
from starpo_trl.models import weights_digest  # noqa: E402
from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer  # noqa: E402

CLIP = 0.05


def step(critic, ids, returns):
    return dist_critic.step(
        critic, ids, returns, max_grad_norm=CLIP
    )  # gradients averaged by hand (a sharded critic ignores it)


def local_numel(t):
    return (
        t.ds_tensor.numel()
        if hasattr(t, "ds_tensor")
        else t.to_local().numel()
        if hasattr(t, "to_local")
        else t.numel()
    )


def main(out):
    if mode == "fsdp":
        from accelerate import Accelerator, FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", state_dict_type="FULL_STATE_DICT"
        )
        accelerator = Accelerator(fsdp_plugin=plugin)
        kwargs = {"fsdp_accelerator": accelerator}
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        stage = 2 if mode == "zero2" else 3
        zero = {
            "stage": stage,
            "stage3_param_persistence_threshold": 0,
            "reduce_bucket_size": "auto",
        }  # "auto": dropped
        if mode == "zero3_offload":  # optimizer state and weights in CPU memory
            zero.update(offload_optimizer={"device": "cpu", "pin_memory": "auto"}, offload_param={"device": "cpu"})
        config = deepspeed_critic_config(
            {"zero_optimization": zero}, micro_batch_size=2, max_grad_norm=CLIP, bf16=False, fp16=False
        )
        kwargs = {"deepspeed_config": config}
    rank = dist.get_rank()
    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_model(tokenizer, seed=0)
    sharded = make_critic(policy, "full", learning_rate=1e-2, value_clip=None, **kwargs)
    plain = make_critic(policy, "full", learning_rate=1e-2, value_clip=None, shard_optimizer=False)
    total = sum(p.numel() for p in plain.trainable_parameters())
    local = sum(local_numel(p) for p in sharded.trainable_parameters())
    generator = torch.Generator().manual_seed(100 + rank)  # a different micro-batch on each process
    batches = [
        (torch.randint(5, 200, (2, 10), generator=generator), torch.rand(2, 5, generator=generator) * 3)
        for _ in range(4)
    ]
    ids0 = batches[0][0]
    values_diff = (
        (sharded.values(ids0, torch.ones_like(ids0), 5, 1) - plain.values(ids0, torch.ones_like(ids0), 5, 1))
        .abs()
        .max()
        .item()
    )
    norms = []
    for ids, returns in batches[:3]:
        norms.append((step(sharded, ids, returns)["value_grad_norm"], step(plain, ids, returns)["value_grad_norm"]))
    if mode == "fsdp":  # AdamW moments this process keeps
        optimizer_local = sum(local_numel(s["exp_avg"]) for s in sharded.optimizer.state.values())
    else:  # fp32 master weights (and so AdamW moments) this process's DeepSpeed optimizer keeps
        groups = (
            sharded.optimizer.single_partition_of_fp32_groups
            if mode == "zero2"
            else sharded.optimizer.fp32_partitioned_groups_flat
        )
        optimizer_local = sum(t.numel() for t in groups)
    max_diff = max((a - b).abs().max().item() for a, b in zip(sharded.full_parameters(), plain.trainable_parameters()))
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, weights_digest(sharded.full_parameters()))
    path = os.path.join(out, "value_model")
    sharded.save(path, write=rank == 0)
    dist.barrier()
    saved = load_file(os.path.join(path, "critic.safetensors"))
    saved_diff = max((saved[f"{i:05d}"] - p).abs().max().item() for i, p in enumerate(sharded.full_parameters()))
    # resume: a new sharded critic from other weights loads the checkpoint; one more step matches
    resumed = make_critic(build_tiny_model(tokenizer, seed=5), "full", learning_rate=1e-2, value_clip=None, **kwargs)
    resumed.load(path)
    step(resumed, *batches[3])
    try:  # a plain critic loads an FSDP checkpoint (the same files), not a DeepSpeed one
        plain.load(path)
        step(plain, *batches[3])
        plain_loads = "loaded"
    except ValueError as e:
        plain_loads = str(e)
    step(sharded, *batches[3])
    after = sharded.full_parameters()
    resume_diff = max((a - b).abs().max().item() for a, b in zip(after, resumed.full_parameters()))
    plain_resume_diff = max((a - b).abs().max().item() for a, b in zip(after, plain.trainable_parameters()))
    result = {
        "mode": mode,
        "total": total,
        "local": local,
        "optimizer_local": optimizer_local,
        "values_diff": values_diff,
        "norms": norms,
        "max_diff": max_diff,
        "digests": digests,
        "saved_diff": saved_diff,
        "resume_diff": resume_diff,
        "plain_loads": plain_loads,
        "plain_resume_diff": plain_resume_diff,
        "moved": any(p.abs().sum().item() > 0 for p in after[-2:]),
    }
    if mode != "fsdp":  # a policy that ZeRO-3 partitioned as it was built: the critic copies its gathered weights
        import deepspeed

        partitioned = build_tiny_model(tokenizer, seed=3)
        deepspeed.zero.Init(
            module=partitioned,
            config_dict_or_path={**config, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
        )
        with deepspeed.zero.GatheredParameters(list(partitioned.parameters())):
            source = [p.detach().clone() for p in decoder_of(partitioned).parameters()]
            result["partitioned_params"] = sum(p.numel() for p in partitioned.parameters())  # whole inside the context
        result["partitioned_at_rest"] = sum(p.numel() for p in partitioned.parameters())
        copied = make_critic(partitioned, "full", **kwargs).full_parameters()[: len(source)]
        result["partitioned_copy_diff"] = max((a - b).abs().max().item() for a, b in zip(copied, source))
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    train.end_process_group()  # every rank done, then the group ended (gloo can abort at exit otherwise)


if __name__ == "__main__":
    main(sys.argv[1])
