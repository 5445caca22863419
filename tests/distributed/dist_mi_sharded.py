"""Run by tests/monitoring/test_mutual_info.py under torchrun (2 CPU processes, gloo): the MI pass on a
policy sharded by DeepSpeed ZeRO-3 (argv[2] = ``zero3``) or Accelerate's FSDP2 (``fsdp``).

The two processes hold samples of different sizes (2 and 3 inputs), so their own forward passes differ
in number; with the weights sharded every forward gathers them from both processes, so each must make
the same number or the run hangs. Each process computes the MI metrics on its sharded policy (reading
each input once and sharing its cache, then every concatenation whole) and on an unsharded copy of
the same weights; the sharded result must equal the mean of the processes' unsharded ones.
Writes ``rank-N.json`` into argv[1].
"""

import json
import math
import os
import sys

mode = sys.argv[2]
if mode == "fsdp":
    os.environ["ACCELERATE_USE_FSDP"] = "true"  # read by tests/sharded_cpu.py
sys.path.insert(0, os.path.dirname(__file__))
import sharded_cpu  # noqa: E402,F401  (DeepSpeed / FSDP on CPU processes)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import train  # noqa: E402
from starpo_trl.monitoring.mutual_info import mi_metrics  # noqa: E402
from starpo_trl.rollout.engine import Episode, StartState  # noqa: E402
from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer  # noqa: E402


class Processes:
    """What ``mi_metrics`` needs of an Accelerator, over torch.distributed (DeepSpeed set it up)."""

    num_processes = 2
    device = torch.device("cpu")

    def gather(self, t):
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)


def episodes(tok, groups):
    """``groups`` start states x 2 episodes, one reply each: a distinct prompt per group, a distinct think."""
    out = []
    for g in range(groups):
        prompt = tok(f"state {g} of the lake:", add_special_tokens=False)["input_ids"]
        for k in range(2):
            reply = tok(f"<think>plan {g} then {k}</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
            out.append(Episode(StartState("starpo/Bandit-v0", g), prompt, reply, [1] * len(reply)))
    return out


def main(out):
    if mode == "fsdp":
        from accelerate import Accelerator, FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
        accelerator = Accelerator(fsdp_plugin=plugin)
        tok = build_tiny_tokenizer()
        sharded = accelerator.prepare(build_tiny_model(tok, seed=0))
        processes = accelerator
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        tok = build_tiny_tokenizer()
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        }
        engine, *_ = deepspeed.initialize(model=build_tiny_model(tok, seed=0), config=config)
        sharded, processes = engine.module, Processes()
    rank = dist.get_rank()
    plain = build_tiny_model(tok, seed=0)
    mine = episodes(tok, 2 + rank)  # 2 inputs here, 3 there
    local = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.to_local().numel() for p in sharded.parameters())
    calls = []
    sharded.register_forward_hook(lambda *a: calls.append(1))
    result = {"local_numel": local, "total_numel": sum(p.numel() for p in plain.parameters())}
    for shared in (True, False):
        calls.clear()
        got = mi_metrics(sharded, mine, tok, 2, batch_size=2, accelerator=processes, shared_prefix=shared)
        own = mi_metrics(plain, mine, tok, 2, batch_size=2, shared_prefix=shared)  # this process alone, unsharded
        everyone = [None, None]
        dist.all_gather_object(everyone, own)
        keys = {k for e in everyone for k in e}  # the mean over the processes that have the key (as nanmean)
        want = {k: sum(e[k] for e in everyone if k in e) / sum(k in e for e in everyone) for k in keys}
        result[f"shared_{shared}"] = {
            "forward_calls": len(calls),
            "num_inputs_own": own["num_inputs"],
            "max_diff": max(abs(got[k] - want[k]) for k in want),
            "keys_equal": sorted(got) == sorted(want),
            "finite": all(math.isfinite(v) for v in got.values()),
            "mi_estimate": got["mi_estimate"],
        }
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    train.end_process_group()  # every rank done, then the group ended (gloo can abort at exit otherwise)


if __name__ == "__main__":
    main(sys.argv[1])
