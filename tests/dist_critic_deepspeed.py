"""Run by tests/test_critic.py under torchrun (2 processes, DeepSpeed on CPU over gloo): the critic
sharded by its own DeepSpeed engine, ZeRO stage argv[2] (``offload`` in argv[3]: offloaded to CPU memory).

Each process holds a DeepSpeed critic and a plain one (no sharding, gradients averaged by hand),
both from the same policy, and steps both on its own micro-batch. The DeepSpeed critic must hold
only its share of the weights (ZeRO-3), match the plain one step for step, save whole weights and a
sharded checkpoint that a new DeepSpeed critic resumes exactly; a critic from a policy that ZeRO-3
partitioned at load (``zero3_init_flag``) starts from that policy's gathered weights.
Writes ``rank-N.json`` into argv[1].
"""

import json
import os
import sys

import deepspeed
import deepspeed.comm.torch
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from starpo_trl.critic import Critic, _decoder, deepspeed_critic_config
from starpo_trl.models import weights_digest
from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer

deepspeed.comm.torch.build_shm_op = lambda: None  # no C++ build of DeepSpeed's shared-memory all-reduce


def average(params):
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def step(critic, ids, returns, ds=False):
    mask = torch.ones_like(returns)
    old = torch.zeros_like(returns)
    return critic.update(ids, torch.ones_like(ids), returns.size(1), old, returns, mask, max_grad_norm=0.05, reduce=None if ds else average)


def full_weights(critic):
    with critic.gathered():
        return [p.detach().clone() for p in critic.trainable_parameters()]


def main(out, stage, offload):
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": "auto"}  # "auto": dropped
    if offload:  # as zero3_offload.yaml: optimizer state and weights in CPU memory
        zero.update(offload_optimizer={"device": "cpu", "pin_memory": "auto"}, offload_param={"device": "cpu"})
    policy_config = {"zero_optimization": zero}
    config = deepspeed_critic_config(policy_config, micro_batch_size=2, max_grad_norm=0.05, bf16=False, fp16=False)
    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_model(tokenizer, seed=0)
    ds = Critic(policy, "full", learning_rate=1e-2, value_clip=None, deepspeed_config=config)
    plain = Critic(policy, "full", learning_rate=1e-2, value_clip=None, shard_optimizer=False)
    total = sum(p.numel() for p in plain.trainable_parameters())
    local = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in ds.trainable_parameters())
    # fp32 master weights (and so AdamW moments) this process's optimizer keeps
    groups = ds.optimizer.fp32_partitioned_groups_flat if stage == 3 else ds.optimizer.single_partition_of_fp32_groups
    optimizer_local = sum(t.numel() for t in groups)
    generator = torch.Generator().manual_seed(100 + rank)  # a different micro-batch on each process
    batches = [(torch.randint(5, 200, (2, 10), generator=generator), torch.rand(2, 5, generator=generator) * 3) for _ in range(4)]
    ids0 = batches[0][0]
    values_diff = (ds.values(ids0, torch.ones_like(ids0), 5, 1) - plain.values(ids0, torch.ones_like(ids0), 5, 1)).abs().max().item()
    norms = []
    for ids, returns in batches[:3]:
        a, b = step(ds, ids, returns, ds=True), step(plain, ids, returns)
        norms.append((a["value_grad_norm"], b["value_grad_norm"]))
    max_diff = max((a - b).abs().max().item() for a, b in zip(full_weights(ds), plain.trainable_parameters()))
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, weights_digest(full_weights(ds)))
    path = os.path.join(out, "value_model")
    ds.save(path, write=rank == 0)
    dist.barrier()
    saved = load_file(os.path.join(path, "critic.safetensors"))
    saved_diff = max((saved[f"{i:05d}"] - p).abs().max().item() for i, p in enumerate(full_weights(ds)))
    # resume: a new DeepSpeed critic from other weights loads the checkpoint; one more step matches
    resumed = Critic(build_tiny_model(tokenizer, seed=5), "full", learning_rate=1e-2, value_clip=None, deepspeed_config=config)
    resumed.load(path)
    step(resumed, *batches[3], ds=True)
    step(ds, *batches[3], ds=True)
    resume_diff = max((a - b).abs().max().item() for a, b in zip(full_weights(ds), full_weights(resumed)))
    plain_loads = None
    try:
        plain.load(path)
    except ValueError as e:
        plain_loads = str(e)
    # a policy that ZeRO-3 partitioned as it was built: the critic copies its gathered weights
    partitioned = build_tiny_model(tokenizer, seed=3)
    deepspeed.zero.Init(module=partitioned, config_dict_or_path={**config, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})
    with deepspeed.zero.GatheredParameters(list(partitioned.parameters())):
        source = [p.detach().clone() for p in _decoder(partitioned).parameters()]
        partitioned_local = sum(p.numel() for p in partitioned.parameters())  # full inside the context
    from_partitioned = Critic(partitioned, "full", deepspeed_config=config)
    copied = full_weights(from_partitioned)[: len(source)]
    result = {
        "stage": stage, "total": total, "local": local, "optimizer_local": optimizer_local, "values_diff": values_diff, "norms": norms, "max_diff": max_diff,
        "digests": digests, "saved_diff": saved_diff, "resume_diff": resume_diff, "plain_loads": plain_loads,
        "moved": any(p.abs().sum().item() > 0 for p in full_weights(ds)[-2:]),
        "partitioned_copy_diff": max((a - b).abs().max().item() for a, b in zip(copied, source)),
        "partitioned_params": partitioned_local, "partitioned_at_rest": sum(p.numel() for p in partitioned.parameters()),
    }
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["offload"])
