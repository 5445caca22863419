"""Run a script under `accelerate launch` with DeepSpeed on CPU processes (gloo), for tests:

    accelerate launch --config_file <deepspeed config, use_cpu: false> tests/deepspeed_cpu.py train.py --config ...

Accelerate only starts DeepSpeed on an accelerator; on a machine without one it would leave each
process believing it is alone while DeepSpeed spans them all. This picks gloo and CPU processes
there instead, and skips the C++ build of DeepSpeed's shared-memory all-reduce (plain gloo is used).
"""

import os
import runpy
import sys

import deepspeed.comm.torch
import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType

_prepare_backend = PartialState._prepare_backend


def _cpu_backend(self, cpu=False, sagemaker_dp=False, backend=None):
    chosen, kind = _prepare_backend(self, cpu, sagemaker_dp, backend)
    if chosen is None and not torch.cuda.is_available() and int(os.environ.get("LOCAL_RANK", -1)) != -1:
        return "gloo", DistributedType.MULTI_CPU
    return chosen, kind


PartialState._prepare_backend = _cpu_backend
deepspeed.comm.torch.build_shm_op = lambda: None

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
