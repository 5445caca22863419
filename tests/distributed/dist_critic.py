"""Run by tests/algorithms/test_critic.py under torchrun (2 processes, gloo): the sharded critic optimizer.

Each process holds a critic with a ZeRO-1 sharded AdamW and one with a plain AdamW, both from the
same policy, and steps both on its own micro-batch with gradients averaged across processes. The
sharded one must match the plain one, be identical on both processes, and save one whole
optimizer state that a plain critic loads; a critic built from different weights on each process
starts from process 0's. Writes ``rank-N.json`` into argv[1].
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import train
from starpo_trl.algorithms.critic import make_critic
from starpo_trl.models import weights_digest
from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer


def average(params):
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def step(critic, ids, returns, max_grad_norm=1.0):
    mask = torch.ones_like(returns)
    return critic.step(
        ids,
        torch.ones_like(ids),
        returns.size(1),
        torch.zeros_like(returns),
        returns,
        mask,
        max_grad_norm,
        reduce=average,
    )


def main(out):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    policy = build_tiny_model(build_tiny_tokenizer(), seed=0)
    sharded = make_critic(policy, "full", learning_rate=1e-2, value_clip=None)
    plain = make_critic(policy, "full", learning_rate=1e-2, value_clip=None, shard_optimizer=False)
    generator = torch.Generator().manual_seed(100 + rank)  # a different micro-batch on each process
    batches = [
        (torch.randint(5, 200, (2, 10), generator=generator), torch.rand(2, 5, generator=generator)) for _ in range(4)
    ]
    for ids, returns in batches[:3]:
        step(sharded, ids, returns)
        step(plain, ids, returns)
    max_diff = max(
        (a - b).abs().max().item() for a, b in zip(sharded.trainable_parameters(), plain.trainable_parameters())
    )
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, weights_digest(sharded.trainable_parameters()))
    local_state = len(sharded.optimizer.optim.state)  # moments this process keeps: its share only
    sharded.save(os.path.join(out, "value_model"), write=rank == 0)
    dist.barrier()
    # resume: a plain critic loads the gathered state; one more step must match the sharded critic's
    resumed = make_critic(policy, "full", learning_rate=1e-2, value_clip=None, shard_optimizer=False)
    resumed.load(os.path.join(out, "value_model"))
    step(resumed, *batches[3])
    step(sharded, *batches[3])
    resume_diff = max(
        (a - b).abs().max().item() for a, b in zip(sharded.trainable_parameters(), resumed.trainable_parameters())
    )
    saved = torch.load(os.path.join(out, "value_model", "critic_optimizer.pt"), weights_only=True)
    # a critic built from different weights on each process starts from process 0's everywhere
    own = build_tiny_model(build_tiny_tokenizer(), seed=rank)
    start, unsynced = [None] * dist.get_world_size(), [None] * dist.get_world_size()
    dist.all_gather_object(start, weights_digest(make_critic(own, "full").trainable_parameters()))
    dist.all_gather_object(
        unsynced, weights_digest(make_critic(own, "full", shard_optimizer=False).trainable_parameters())
    )
    result = {
        "start_digests": start,
        "unsynced_digests": unsynced,
        "sharded": sharded.sharded,
        "num_params": len(sharded.trainable_parameters()),
        "local_state": local_state,
        "saved_state": len(saved["state"]),
        "max_diff": max_diff,
        "resume_diff": resume_diff,
        "digests": digests,
        "moved": any(p.abs().sum().item() > 0 for p in sharded.model.head.parameters()),
    }
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    train.end_process_group()  # every rank done, then the group ended (gloo can abort at exit otherwise)


if __name__ == "__main__":
    main(sys.argv[1])
