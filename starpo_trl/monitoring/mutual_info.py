"""Does the reasoning still depend on the input? Mutual-information collapse metrics.

Entropy and in-group reward std can stay flat while the reasoning turns into one template that
fits every input. This module measures that directly on a sample of (input, reasoning) pairs of a
rollout: X is everything the model saw before its reasoning (the prompt, earlier turns, and the
``<think>`` tag itself), Z the reasoning tokens (between the tags, neither tag included). Each
sampled reasoning ``z_i`` is scored under every distinct input ``x_j`` of the sample by teacher
forcing, ``l_j(z_i) = log p(z_i | x_j)``, and from that matrix (``mi_statistics``):

- ``conditional_entropy`` H(Z|X) = -mean_i l_{x(i)}(z_i) (the reasoning's own input);
- ``reasoning_entropy`` H(Z) = -mean_i log((1/N) sum_j exp l_j(z_i)) (the inputs as a uniform mixture);
- ``mi_estimate`` I(X;Z) = H(Z) - H(Z|X), at most log N (``mi_upper_bound``) for N distinct inputs;
- ``retrieval_accuracy``: the share of reasonings whose own input scores them highest (chance 1/N);
- ``own_input_zscore``: per reasoning, how many standard deviations its own input's score lies above
  the other inputs' scores, averaged (N > 2);
- ``mi_zscore`` / ``mi_zscore_seq``: RAGEN's statistic under RAGEN's names, the mean over reasonings of
  (own-input score - mixture score) / (population std of the mixture scores + 1e-3), on per-token
  scores / on per-reasoning sums (``marginal_std`` / ``marginal_std_seq``: that std).

All in nats per reasoning (sums over its tokens) unless named ``*_per_token`` (each score divided by
the reasoning's length first) or said otherwise above. A policy whose reasoning ignores its input has
I = 0, retrieval at chance and z-scores 0, whatever its entropy.
"""

from __future__ import annotations

import copy
import math

import torch
import transformers
from packaging import version

from starpo_trl.monitoring.mi_statistics import (  # noqa: F401  (the statistics, also importable from here)
    EMANormalizer,
    mi_forward_passes,
    mi_sample_statistics,
    mi_statistics,
)
from starpo_trl.rollout import Episode

# what a model's forward calls its key-value cache (argument and output): renamed in transformers 5.24
CACHE_NAME = "cache" if version.parse(transformers.__version__) >= version.parse("5.24") else "past_key_values"

# the statistics the trainer logs as collapse/<key> (first: the one whose running z-score is logged too)
MI_KEYS = (
    "mi_estimate",
    "conditional_entropy",
    "reasoning_entropy",
    "mi_upper_bound",
    "retrieval_accuracy",
    "retrieval_chance",
    "own_input_zscore",
    "mi_zscore",
    "mi_zscore_seq",
    "marginal_std",
    "marginal_std_seq",
    "mi_estimate_per_token",
    "conditional_entropy_per_token",
    "reasoning_entropy_per_token",
    "num_inputs",
    "num_reasonings",
)


def reasoning_span(tokenizer, reply: list[int], prefix: str = "") -> tuple[int, int] | None:
    """Token indices ``[start, end)`` of the reasoning inside one reply's tokens: the tokens after the
    one that completes ``<think>`` and before the one that starts ``</think>``. None when the reply
    has no closed, non-empty think block. Tokens are located by decoding prefixes, so a token that
    straddles a tag belongs to X (opening) or is left out (closing). ``prefix``: the text the prompt
    opened the reply with (``reply_prefix``): a ``<think>`` there puts the reasoning from token 0."""
    text = prefix + tokenizer.decode(reply, skip_special_tokens=False)
    open_at = text.find("<think>")
    close_at = text.find("</think>", open_at + 1) if open_at >= 0 else -1
    if open_at < 0 or close_at < 0:
        return None
    start = end = None
    for k in range(len(reply) + 1):
        length = len(prefix) + len(tokenizer.decode(reply[:k], skip_special_tokens=False))
        if start is None and length >= open_at + len("<think>"):
            start = k
        if length <= close_at:
            end = k
    if start is None or end is None or end <= start:
        return None
    return start, end


def reasoning_pairs(
    episodes: list[Episode],
    tokenizer,
    turn: str = "first",
    generator: torch.Generator | None = None,
    prefix: str = "",
) -> list[tuple[list[int], list[int]]]:
    """(X, Z) token lists, one per episode with a reasoning at the chosen turn: ``first`` (each episode's
    first reply) or ``uniform`` (one of its replies drawn uniformly). X holds the prompt, the earlier
    turns with their env tokens, and the reply's tokens up to and including ``<think>`` (``prefix``: the
    ``reply_prefix`` text every reply was opened with in its prompt)."""
    pairs = []
    for ep in episodes:
        mask = ep.env_mask
        turns, start = [], None
        for t, m in enumerate(mask + [0]):  # runs of model tokens are the replies
            if m and start is None:
                start = t
            elif not m and start is not None:
                turns.append((start, t))
                start = None
        if not turns:
            continue
        k = 0 if turn == "first" else int(torch.randint(len(turns), (1,), generator=generator))
        a, b = turns[k]
        span = reasoning_span(tokenizer, ep.completion_ids[a:b], prefix)
        if span is None:
            continue
        # what the model read before this reply: the whole history, or with a context window that turn's prompt
        before = ep.turn_prompts[k] if k < len(ep.turn_prompts) else ep.prompt_ids + ep.completion_ids[:a]
        x = before + ep.completion_ids[a : a + span[0]]
        z = ep.completion_ids[a + span[0] : a + span[1]]
        pairs.append((x, z))
    return pairs


def _padded(seqs: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their attention mask."""
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, seq in enumerate(seqs):
        ids[r, : len(seq)] = torch.tensor(seq)
        attention[r, : len(seq)] = 1
    return ids, attention


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log p(targets[:, t])`` from ``logits[:, t]`` (scaled by ``1 / temperature``)."""
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logps.gather(-1, targets[..., None])[..., 0]


def _score_shared_prefix(model, inputs, reasonings, pad_token_id, batch_size, temperature, device, out) -> int:
    """``cross_logprobs`` into ``out``, each input read once (its cache copied under the reasonings); returns
    the forward passes made."""
    made = 0
    for j, x in enumerate(inputs):
        ids = torch.tensor([x], device=device)
        read = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
        made += 1
        past = read.get(CACHE_NAME)
        if not hasattr(past, "batch_repeat_interleave"):
            raise ValueError(
                f"{type(model).__name__} returned no extendable key-value cache for the MI pass's shared prefix: "
                "set mi_metrics_shared_prefix=False (every input + reasoning read whole)"
            )
        first = torch.log_softmax(read.logits[0, -1].float() / temperature, dim=-1).cpu()
        for b in range(0, len(reasonings), batch_size):
            chunk = reasonings[b : b + batch_size]
            cache = copy.deepcopy(past)
            cache.batch_repeat_interleave(len(chunk))
            ids, attention = _padded(chunk, pad_token_id)
            attention = torch.cat([torch.ones((len(chunk), len(x)), dtype=torch.long), attention], dim=1)
            logits = model(
                input_ids=ids.to(device), attention_mask=attention.to(device), use_cache=True, **{CACHE_NAME: cache}
            ).logits
            made += 1
            logps = _token_logprobs(logits[:, :-1], ids[:, 1:].to(device), temperature).cpu()
            for r, z in enumerate(chunk):  # z[0] from the input's last logit, z[t] from the logit at t - 1
                out[b + r, j] = first[z[0]] + logps[r, : len(z) - 1].sum()
    return made


def _score_whole(model, inputs, reasonings, pad_token_id, batch_size, temperature, device, out) -> int:
    """``cross_logprobs`` into ``out``, every (input, reasoning) concatenation read whole; returns the
    forward passes made."""
    jobs = [(i, j) for i in range(len(reasonings)) for j in range(len(inputs))]
    for b in range(0, len(jobs), batch_size):
        chunk = jobs[b : b + batch_size]
        ids, attention = _padded([inputs[j] + reasonings[i] for i, j in chunk], pad_token_id)
        logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
        logps = _token_logprobs(logits[:, :-1], ids[:, 1:].to(device), temperature).cpu()
        for r, (i, j) in enumerate(chunk):
            first = len(inputs[j]) - 1  # the logit at position t predicts token t + 1
            out[i, j] = logps[r, first : first + len(reasonings[i])].sum()
    return -(-len(jobs) // batch_size)


@torch.no_grad()
def cross_logprobs(
    model,
    inputs: list[list[int]],
    reasonings: list[list[int]],
    pad_token_id: int,
    batch_size: int = 16,
    temperature: float = 1.0,
    num_batches: int = 0,
    shared_prefix: bool = True,
) -> torch.Tensor:
    """``out[i, j] = sum_t log p(z_i[t] | x_j, z_i[:t])`` under ``model`` (logits / ``temperature``), by teacher
    forcing. (Nz, Nx), float32.

    ``shared_prefix``: each input is read once and its key-value cache is copied under ``batch_size``
    reasonings at a time (``Nx * (|x| + Nz * |z|)`` tokens instead of ``Nx * Nz * (|x| + |z|)``: with long
    multi-turn inputs and short reasonings, about Nz times cheaper); it needs a model whose cache can be
    extended by several tokens (every standard decoder). Otherwise every (x_j, z_i) concatenation is
    read whole, ``batch_size`` at a time. At least ``num_batches`` forward passes are made (the extra ones
    on a two-token stand-in): where the weights are sharded (ZeRO-3, FSDP) every process must make the
    same number (``mi_forward_passes`` counts them)."""
    device = next(model.parameters()).device
    out = torch.empty(len(reasonings), len(inputs))
    made = 0
    if reasonings:
        score = _score_shared_prefix if shared_prefix else _score_whole
        made = score(model, inputs, reasonings, pad_token_id, batch_size, temperature, device, out)
    for _ in range(made, num_batches):  # stand-ins: the same number of passes on every process
        ids = torch.full((1, 2), pad_token_id, dtype=torch.long, device=device)
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return out


def mi_sample(
    episodes: list[Episode],
    tokenizer,
    group_size: int,
    max_inputs: int = 8,
    per_input: int = 2,
    turn: str = "first",
    generator: torch.Generator | None = None,
    prefix: str = "",
) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The (input, reasoning) sample of a rollout (episodes grouped by start state, ``group_size``
    each): up to ``max_inputs`` groups, ``per_input`` episodes of each. Returns the distinct inputs,
    the reasonings and each reasoning's input index (with ``turn="first"`` a group's copies share
    their input; identical inputs are merged wherever they come from)."""
    xs, zs, own, index = [], [], [], {}
    groups = [episodes[g : g + group_size] for g in range(0, len(episodes), group_size)][:max_inputs]
    for group in groups:
        for x, z in reasoning_pairs(group, tokenizer, turn, generator, prefix)[:per_input]:
            if tuple(x) not in index:
                index[tuple(x)] = len(xs)
                xs.append(x)
            zs.append(z)
            own.append(index[tuple(x)])
    return xs, zs, own


def mi_from_sample(
    model,
    sample: tuple[list[list[int]], list[list[int]], list[int]],
    pad_token_id: int,
    batch_size: int = 16,
    temperature: float = 1.0,
    num_batches: int = 0,
    shared_prefix: bool = True,
) -> dict[str, float]:
    """``mi_statistics`` (per reasoning and ``*_per_token``) of a ``mi_sample``; empty when it holds
    fewer than two inputs (the forward passes ``num_batches`` asks for are still made)."""
    xs, zs, own = sample
    if len(xs) < 2:
        xs, zs = [], []
    cross = cross_logprobs(model, xs, zs, pad_token_id, batch_size, temperature, num_batches, shared_prefix)
    if not xs:
        return {}
    return mi_sample_statistics(cross, torch.tensor(own), [len(z) for z in zs])


def mi_metrics(
    model,
    episodes: list[Episode],
    tokenizer,
    group_size: int,
    max_inputs: int = 8,
    per_input: int = 2,
    turn: str = "first",
    batch_size: int = 16,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    accelerator=None,
    prefix: str = "",
    shared_prefix: bool = True,
) -> dict[str, float]:
    """The ``MI_KEYS`` statistics of ``mi_sample(episodes, ...)``, the model in eval mode meanwhile;
    empty when the sample holds fewer than two inputs. With an ``accelerator`` of several processes
    this is collective: each process passes its own episodes, every one makes the same number of
    forward passes (sharded weights gather) and gets the statistics averaged over the processes."""
    sample = mi_sample(episodes, tokenizer, group_size, max_inputs, per_input, turn, generator, prefix)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    inputs = len(sample[0]) if len(sample[0]) >= 2 else 0
    batches = mi_forward_passes(inputs, len(sample[1]) if inputs else 0, batch_size, shared_prefix)
    several = accelerator is not None and accelerator.num_processes > 1
    if several:
        batches = int(accelerator.gather(torch.tensor([batches], device=accelerator.device)).max())
    was_training = model.training
    model.eval()
    try:
        stats = mi_from_sample(model, sample, pad, batch_size, temperature, batches, shared_prefix)
    finally:
        model.train(was_training)
    values = torch.tensor([stats.get(k, math.nan) for k in MI_KEYS], dtype=torch.float64)
    if several:
        values = accelerator.gather(values[None].to(accelerator.device)).nanmean(dim=0)
    return {key: value for key, value in zip(MI_KEYS, values.tolist()) if math.isfinite(value)}
