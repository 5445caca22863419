"""Episodes as TRL's GRPO batch: left-padded prompts, right-padded completions, env tokens masked."""

from __future__ import annotations

import torch
from trl.trainer.utils import pad

from starpo_trl.rollout.engine import Episode


def padded_rows(rows: int, micro_batches: int) -> int:
    """How many rows a process's share of ``rows`` kept episodes becomes: the next multiple of
    ``micro_batches`` (at least one row per micro-batch), so TRL splits it into equal micro-batches.
    The added rows hold no model token (``tool_mask`` 0)."""
    return max(1, -(-rows // micro_batches)) * micro_batches


def episode_rows(episodes: list[Episode]) -> tuple[list[Episode], list[int]]:
    """The training rows of ``episodes`` and the index of each row's episode. An episode played with
    the whole history in context is one row; one played with a context window (``turn_prompts``
    set) is one row per turn: the tokens that turn's reply was sampled from, then the reply
    (verbatim, with its logprobs)."""
    rows, owner = [], []
    for k, ep in enumerate(episodes):
        if not ep.turn_prompts:
            rows.append(ep)
            owner.append(k)
            continue
        spans = [(a, end + 1) for a, end in zip(ep.reply_starts, ep.turn_end_positions)]  # each turn's reply
        for j, (prompt, (a, b)) in enumerate(zip(ep.turn_prompts, spans)):
            rows.append(
                Episode(
                    start=ep.start,
                    prompt_ids=list(prompt),
                    completion_ids=ep.completion_ids[a:b],
                    env_mask=[1] * (b - a),
                    logprobs=ep.logprobs[a:b],
                    turn_rewards=ep.turn_rewards[j : j + 1],
                    turn_end_positions=[b - a - 1],
                    env_error=ep.env_error,
                    masked_turns=[0] if j in ep.masked_turns else [],
                )
            )
            owner.append(k)
    return rows, owner


def episode_filter_values(episodes: list[Episode], metric: str) -> tuple[list[float] | None, list[int] | None]:
    """What the rollout filter's ``entropy`` / ``length`` metrics read per episode (None when unused):
    the mean ``-log p`` of the sampled model tokens (an estimate of the policy's per-token entropy;
    NaN for an episode without model tokens), and the number of model tokens."""
    lengths = [sum(ep.env_mask) for ep in episodes]
    if metric == "length":
        return None, lengths
    if metric != "entropy":
        return None, None
    entropies = [
        -sum(lp for lp, m in zip(ep.logprobs, ep.env_mask) if m) / n if n else float("nan")
        for ep, n in zip(episodes, lengths)
    ]
    return entropies, None


def trained_mask(ep: Episode) -> list[int]:
    """``env_mask`` with the replies of ``masked_turns`` (cut replies under ``overlong_turns: mask``) set to 0: the
    model tokens the loss trains on. A per-turn row (context window) is its one reply from token 0."""
    mask = list(ep.env_mask)
    starts = ep.reply_starts or [0]
    for t in ep.masked_turns:
        mask[starts[t] : ep.turn_end_positions[t] + 1] = [0] * (ep.turn_end_positions[t] + 1 - starts[t])
    return mask


def episodes_to_tensors(episodes: list[Episode], pad_token_id: int, device) -> dict[str, torch.Tensor]:
    """TRL's batch layout: left-padded prompts, right-padded completions, env tokens (and masked cut replies,
    ``trained_mask``) as ``tool_mask`` 0."""
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
        [torch.tensor(trained_mask(ep), dtype=torch.long) for ep in episodes], padding_value=0, padding_side="right"
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


PROMPT_AXIS = ("prompt_ids", "prompt_mask")


def trim_completion_padding(batch: dict) -> dict:
    """A micro-batch without its trailing completion columns that are padding in every row (``completion_mask``
    0): a causal model's outputs at the kept positions do not depend on later ones, so the loss is the same
    for less work. TRL pads every micro-batch to the longest completion of the whole generation batch; a
    micro-batch of shorter episodes carries that padding through the forward and backward passes. Every
    tensor on the completion axis (2-D and as wide as ``completion_ids``; not the prompt's) is cut alike."""
    mask = batch["completion_mask"]
    width = mask.size(1)
    real = mask.any(dim=0).nonzero()
    keep = int(real[-1]) + 1 if len(real) else 1
    if keep == width:
        return batch
    return {
        key: value[:, :keep]
        if torch.is_tensor(value) and value.dim() >= 2 and value.size(1) == width and key not in PROMPT_AXIS
        else value
        for key, value in batch.items()
    }


def turn_token_values(rows: list[Episode], owner: list[int], per_turn: list[list[float]], width: int) -> torch.Tensor:
    """``(len(rows), width)``: each training row's model tokens carry their turn's value, ``per_turn[k][t]`` for
    turn ``t`` of episode ``k = owner[r]``. A whole-episode row's turns are its reply spans (``reply_starts`` to
    ``turn_end_positions``; env tokens between them stay 0); a per-turn row (context window, ``episode_rows``) is
    turn ``j``, its rank among its episode's rows, on all its tokens. Rows past ``len(owner)`` (padding) are 0."""
    out = torch.zeros(len(rows), width)
    rank: dict[int, int] = {}
    for r, k in enumerate(owner):
        row, j = rows[r], rank.get(k, 0)
        rank[k] = j + 1
        if not per_turn[k]:
            continue
        if row.reply_starts:  # the whole episode in one row
            for t, (a, b) in enumerate(zip(row.reply_starts, row.turn_end_positions)):
                out[r, a : b + 1] = per_turn[k][t]
        else:
            out[r, : len(row.completion_ids)] = per_turn[k][j]
    return out
