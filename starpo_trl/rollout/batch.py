"""Episodes as TRL's GRPO batch: left-padded prompts, right-padded completions, env tokens masked."""

from __future__ import annotations

import torch
from trl.trainer.utils import pad

from starpo_trl.rollout.engine import Episode


def episodes_to_tensors(episodes: list[Episode], pad_token_id: int, device) -> dict[str, torch.Tensor]:
    """TRL's batch layout: left-padded prompts, right-padded completions, env tokens as ``tool_mask`` 0."""
    prompt_ids = pad([torch.tensor(ep.prompt_ids) for ep in episodes], padding_value=pad_token_id, padding_side="left")
    prompt_mask = pad(
        [torch.ones(len(ep.prompt_ids), dtype=torch.long) for ep in episodes], padding_value=0, padding_side="left"
    )
    completion_ids = pad(
        [torch.tensor(ep.completion_ids, dtype=torch.long) for ep in episodes],
        padding_value=pad_token_id,
        padding_side="right",
    )
    completion_mask = pad(
        [torch.ones(len(ep.completion_ids), dtype=torch.long) for ep in episodes],
        padding_value=0,
        padding_side="right",
    )
    tool_mask = pad(
        [torch.tensor(ep.env_mask, dtype=torch.long) for ep in episodes], padding_value=0, padding_side="right"
    )
    logps = pad(
        [torch.tensor(ep.logprobs, dtype=torch.float32) for ep in episodes], padding_value=0.0, padding_side="right"
    )
    if completion_ids.size(1) == 0:
        # no episode has a completion token (all failed in reset): one masked padding column keeps
        # TRL's shapes valid (logits_to_keep=0 would mean "all positions" to the model)
        completion_ids = torch.full((len(episodes), 1), pad_token_id, dtype=torch.long)
        completion_mask, tool_mask = torch.zeros_like(completion_ids), torch.zeros_like(completion_ids)
        logps = torch.zeros(len(episodes), 1)
    return {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "tool_mask": tool_mask.to(device),
        "sampling_per_token_logps": logps.to(device),
    }
