"""Run a script under `accelerate launch` with DeepSpeed or FSDP on CPU processes (gloo), for tests:

    accelerate launch --config_file <DeepSpeed or FSDP config, use_cpu: false> tests/sharded_cpu.py train.py --config ...

Accelerate starts DeepSpeed and FSDP only on accelerators; on a machine without one it would leave
each process believing it is alone. This picks gloo and CPU processes there instead (as a
multi-device run, so that Accelerate selects FSDP), and skips the C++ build of DeepSpeed's
shared-memory all-reduce (plain gloo is used).
"""

import os
import runpy
import sys

import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType

_prepare_backend = PartialState._prepare_backend
_set_device = PartialState.set_device


def _launched_without_accelerator() -> bool:
    return not torch.cuda.is_available() and int(os.environ.get("LOCAL_RANK", -1)) != -1


def _cpu_backend(self, cpu=False, sagemaker_dp=False, backend=None):
    chosen, kind = _prepare_backend(self, cpu, sagemaker_dp, backend)
    if chosen is None and _launched_without_accelerator():
        fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        return "gloo", DistributedType.MULTI_GPU if fsdp else DistributedType.MULTI_CPU
    return chosen, kind


def _cpu_device(self):
    if self.device is None and _launched_without_accelerator() and self.distributed_type == DistributedType.MULTI_GPU:
        self.device = torch.device("cpu")
        return
    _set_device(self)


PartialState._prepare_backend = _cpu_backend
PartialState.set_device = _cpu_device
if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
    import deepspeed.comm.torch

    deepspeed.comm.torch.build_shm_op = lambda: None

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
