"""Adapter-only weight sync for LoRA policies in vLLM colocate mode (``vllm_lora_sync=True``).

TRL's ``sync_weights`` merges the LoRA adapter into the base and pushes every weight of the model
to vLLM before each rollout. With ``vllm_lora_sync`` vLLM instead keeps the frozen base it loaded
once and serves the policy's adapter through its own LoRA support:

- the engine is created with ``enable_lora=True`` and ``max_lora_rank`` covering the adapter's rank
  (``lora_engine``: a patch of the ``LLM`` that TRL's ``VLLMGeneration`` builds, for the time of
  the trainer's construction);
- before each rollout with new weights, ``AdapterSync.push`` saves the ``default`` adapter (a few
  MB) and every later ``generate`` carries a ``LoRARequest`` with a new id, so vLLM loads the new
  adapter; its prefix cache is keyed by adapter, so turn t+1 still reuses turn t's prefix.

Colocate mode only (``trl vllm-serve`` has no endpoint to load an adapter), and not with sleep
mode (waking from it re-pushes the merged weights) or ZeRO-3 / FSDP (the adapter is sharded there).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from contextlib import contextmanager

VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts that holds an adapter of rank ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(
        f"LoRA rank {rank} is above the largest vLLM serves ({VLLM_LORA_RANKS[-1]}): lower lora_r or set vllm_lora_sync=False."
    )


def lora_rank(model, peft_config=None) -> int:
    """The rank of the policy's LoRA adapter: from ``peft_config``, or the model's ``default`` adapter."""
    if peft_config is not None and getattr(peft_config, "r", None) is not None:
        return int(peft_config.r)
    config = getattr(model, "peft_config", {}).get("default") if not isinstance(model, str) else None
    if config is None or getattr(config, "r", None) is None:
        raise ValueError(
            "vllm_lora_sync needs a LoRA policy: pass a peft_config (train.py: --use_peft true) or a PEFT model, or set vllm_lora_sync=False."
        )
    return int(config.r)


@contextmanager
def lora_engine(rank: int):
    """While inside, TRL's ``VLLMGeneration`` creates its ``LLM`` with LoRA support for ``rank``."""
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    vllm_generation.LLM = functools.partial(original, enable_lora=True, max_lora_rank=max_lora_rank(rank), max_loras=1)
    try:
        yield
    finally:
        vllm_generation.LLM = original


class LoRALLM:
    """Wraps a ``vllm.LLM``: every ``generate`` carries the current adapter; all else is the LLM's."""

    def __init__(self, llm):
        self.llm = llm
        self.lora_request = None

    def generate(self, *args, **kwargs):
        kwargs.setdefault("lora_request", self.lora_request)
        return self.llm.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.llm, name)


class AdapterSync:
    """Pushes the policy's ``default`` LoRA adapter to a colocated vLLM engine (see the module doc)."""

    keep = 2  # adapter folders kept on disk: the one in use and the one before it

    def __init__(self, vllm_generation, model, directory: str | None = None, sharded: bool = False):
        """``sharded``: the policy is sharded (ZeRO-3, FSDP), which this sync refuses: it saves the
        adapter from each process."""
        if sharded:
            raise ValueError(
                "vllm_lora_sync saves the adapter from each process, which ZeRO-3 / FSDP shard: use ZeRO-2 or "
                "DDP, or vllm_lora_sync=False."
            )
        self.generation = vllm_generation
        self.model = model  # the unwrapped PeftModel
        self.directory = directory or tempfile.mkdtemp(prefix="starpo-vllm-lora-")
        if not isinstance(vllm_generation.llm, LoRALLM):
            vllm_generation.llm = LoRALLM(vllm_generation.llm)
        self.pushed: list[str] = []
        self.pushes = 0

    def push(self, step: int):
        """Save the adapter as it is now and make the next generations use it."""
        from vllm.lora.request import LoRARequest

        path = os.path.join(self.directory, f"step-{step}")
        self.model.save_pretrained(path, selected_adapters=["default"])
        if os.path.isdir(os.path.join(path, "default")):  # PEFT saves a non-default-named selection in a subfolder
            path = os.path.join(path, "default")
        # a new id per push: vLLM caches adapters by id, so a reused id would keep serving old weights
        self.pushes += 1
        self.generation.llm.lora_request = LoRARequest(f"policy-step-{step}", self.pushes, path)
        self.pushed.append(os.path.join(self.directory, f"step-{step}"))
        for old in self.pushed[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self.pushed = self.pushed[-self.keep :]
        return self.generation.llm.lora_request
