"""Generation with a Hugging Face model: sampling from the plain softmax, sampled-token logprobs,
KV reuse across turns and shared prompts."""

from __future__ import annotations

import functools

import torch
import transformers
from packaging.version import Version
from transformers.cache_utils import DynamicLayer

# transformers 5.24 renamed ``past_key_values`` to ``cache``, as a ``generate`` / forward argument and
# as a field of their outputs; before it, ``generate(cache=...)`` is refused as an unused argument
CACHE_KEY = "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"


def sampling_config(max_new_tokens: int, temperature: float, eos_token_ids: list[int], pad_token_id: int):
    """A ``GenerationConfig`` that samples from exactly ``softmax(logits / temperature)``.

    Every logits processor a checkpoint's ``generation_config`` may bring (repetition penalty,
    top-k / top-p / min-p, typical / epsilon / eta cutoffs, n-gram blocking, a minimum length, ...)
    is set to its neutral value, because TRL's loss and the recorded sampling logprobs are
    ``log_softmax(logits / T)``: tokens drawn from any other distribution would carry wrong ratios.
    """
    from transformers import GenerationConfig

    greedy = temperature <= 0
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        temperature=1.0 if greedy else temperature,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=1.0,
        encoder_repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        renormalize_logits=False,
        eos_token_id=list(eos_token_ids),
        pad_token_id=pad_token_id,
        return_dict_in_generate=True,
    )


class HFBackend:
    """Generation with ``model.generate``, sampling at ``temperature`` from the plain softmax: no
    top-k/top-p, and none of the processors a checkpoint's ``generation_config`` sets
    (``sampling_config``; the model's own config is set aside during the call, so nothing of it
    fills the unset fields).

    Logprobs are ``log_softmax(logits / temperature)`` of the sampled tokens: the same quantity
    TRL's loss computes, so the importance ratio starts at exactly 1 on-policy.

    KV reuse across turns (``reuse_cache``, on for full-attention models): each call keeps, per
    sequence, the keys and values it computed (prompt, history and the new reply but its last
    token). A sequence of the next call that extends a kept one (same tokens, plus the reply's last
    token and the next observation) feeds only its new tokens; the kept rows are laid out right-aligned
    in one cache, the new tokens left-padded after it, and the attention mask hides the gaps, so each
    row sees exactly its own tokens at their own positions. The engine calls ``reset()`` at the start
    of every rollout: kept values belong to the weights they were computed with. With the same cache
    layout, identical new sequences (the copies of a start state in a group) are read once and shared.

    With ``done`` (the engine's rule for a complete reply: its episode's token limit, a stop string),
    each row stops sampling there and the call ends when every row has; the reply returned and
    its kept cache are the cut one, so the next turn hits the cache after a cut reply too.

    Each call's cache is allocated once for its full length (kept history + new tokens + the token
    limit, ``_CallLayer``) and written in place: ``DynamicCache`` appends by concatenation, copying
    the whole cache for every sampled token, work that grows with rows x history.

    Finished rows leave the batch (``drop_finished_rows``, with KV reuse): ``generate`` pads a row whose
    reply has ended and keeps computing it until the last reply ends. Once a quarter of a call's rows
    (``DROP_SHARE``) are done and ``MIN_STEPS_LEFT`` or more tokens of the limit remain, the call ends there and the
    rows still sampling go on in a new call from their kept cache (feeding the last token they sampled,
    as the next decode step would), so the batch shrinks as replies end. Every token is still drawn from
    ``softmax(logits / T)``, but the random draws are not the ones a single call would make.
    """

    stops_rows = True  # the engine passes ``done``: each row stops at its own limit / stop string
    # a call ends early once this share of its rows is done (a rollout's replies often end in two clusters: short
    # ones at the stop string, long ones at the limit; half of the rows was seldom reached) and at least
    # MIN_STEPS_LEFT tokens of its limit are left, to pay for laying out the cache again
    DROP_SHARE = 0.25
    MIN_STEPS_LEFT = 8

    def __init__(
        self,
        model,
        pad_token_id: int,
        eos_token_ids: list[int],
        reuse_cache: bool = True,
        drop_finished_rows: bool = True,
    ):
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.full_attention = _full_attention(model)
        self.reuse_cache = reuse_cache and self.full_attention
        self.drop_finished_rows = drop_finished_rows and self.reuse_cache
        self.prefill_tokens = 0  # tokens run through the model before sampling, over all calls
        self.decode_steps = 0  # sampling steps (batched), over all calls
        self.row_steps = 0  # rows x sampling steps, over all calls: decode work, finished rows included
        self.reply_tokens = 0  # tokens of the replies returned, over all calls: the decode work that was used
        self._kept: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []

    def reset(self) -> None:
        self._kept = []

    def _match(self, sequences) -> list:
        """For each sequence, the kept entry it extends (in order: the engine keeps episode order), or None."""
        found, j = [], 0
        for seq in sequences:
            hit = None
            for k in range(j, len(self._kept)):
                tokens = self._kept[k][0]
                if len(tokens) < len(seq) and seq[: len(tokens)] == tokens:
                    hit, j = self._kept[k], k + 1
                    break
            found.append(hit)
        return found

    @torch.no_grad()
    def generate(self, sequences, max_new_tokens, temperature, done=None):
        """``done(i, ids)``: row ``i``'s reply ``ids`` is complete (its token limit, a stop string): the row
        stops there and its reply ends with that token, and the call ends when every row has.
        -> one ``(reply ids, their sampling logprobs)`` per sequence."""
        replies = [([], []) for _ in sequences]
        rows = list(range(len(sequences)))  # the rows still sampling
        kept: dict[int, tuple] = {}  # row -> its kept entry, from the call its reply ended in
        budget = max_new_tokens
        while rows:
            row_done = _Continued(done, rows, replies) if done is not None else None
            early = self.drop_finished_rows and len(rows) > 1
            results, ended, entries = self._call(
                [list(sequences[i]) + replies[i][0] for i in rows],
                budget,
                temperature,
                row_done,
                early,
                continued=budget < max_new_tokens,
            )
            for k, i in enumerate(rows):
                replies[i][0].extend(results[k][0])
                replies[i][1].extend(results[k][1])
            kept.update({rows[k]: entries[k] for k in entries if ended[k]})
            steps = max((len(ids) for ids, _ in results), default=0)
            going = [k for k in range(len(rows)) if not ended[k]]
            if going and steps == 0:
                raise RuntimeError("generate sampled no token for rows that had not ended")
            self._kept = [entries[k] for k in going]  # the next call's rows extend these
            rows, budget = [rows[k] for k in going], budget - steps
        self._kept = [kept[i] for i in range(len(sequences)) if i in kept] if self.reuse_cache else []
        self.reply_tokens += sum(len(ids) for ids, _ in replies)
        return [(ids, lps) for ids, lps in replies]

    def _call(self, sequences, max_new_tokens, temperature, done, early: bool, continued: bool):
        """One ``model.generate`` call over ``sequences`` (each extending its kept entry, if any). ``early``:
        end the call once ``DROP_SHARE`` of the rows are done (``MIN_STEPS_LEFT`` tokens or more left). ``continued``:
        these rows' replies began in an earlier call, so the token each feeds is a decode step, not prefill.
        -> each row's (ids, logprobs), whether it ended (a stop, an end-of-turn token, the limit), and each
        row's entry to keep (``{row: (tokens, per-layer keys and values)}``; none without KV reuse)."""
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        device = next(self.model.parameters()).device
        kept = self._match(sequences) if self.reuse_cache else [None] * len(sequences)
        if self.reuse_cache:
            kept = self._share_prompts(sequences, kept, device)
        cached = [0 if k is None else len(k[0]) for k in kept]
        suffixes = [seq[c:] for seq, c in zip(sequences, cached)]
        n, lc, ls = len(sequences), max(cached), max(len(x) for x in suffixes)
        input_ids = torch.full((n, ls), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((n, lc + ls), dtype=torch.long)
        for i, (c, suffix) in enumerate(zip(cached, suffixes)):
            input_ids[i, ls - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            attention_mask[i, lc - c : lc] = 1
            attention_mask[i, lc + ls - len(suffix) :] = 1
        self.prefill_tokens += 0 if continued else sum(len(x) for x in suffixes)
        past = self._sampling_cache(kept, cached, lc + ls + max_new_tokens, device)
        # the kept rows now live in ``past``: drop them so the cache is not held twice while sampling
        # (a long evaluation's cache can take many GB)
        self._kept, kept = [], None
        greedy = temperature <= 0
        was_training = self.model.training
        self.model.eval()
        own = self.model.generation_config
        self.model.generation_config = GenerationConfig()  # nothing of the checkpoint's sampling settings leaks in
        record = _SampledLogprobs(1.0 if greedy else temperature)
        until = max_new_tokens - self.MIN_STEPS_LEFT if early else None
        rows_done = _RowsDone(done, ls, self.eos_token_ids, early_until=until, drop_share=self.DROP_SHARE)
        rows_done = rows_done if done is not None or early else None
        try:
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                **{CACHE_KEY: past},
                generation_config=sampling_config(max_new_tokens, temperature, self.eos_token_ids, self.pad_token_id),
                logits_processor=LogitsProcessorList([record]),
                stopping_criteria=StoppingCriteriaList([rows_done] if rows_done else []),
            )
        finally:
            self.model.generation_config = own
        if was_training:
            self.model.train()
        new_tokens = out.sequences[:, ls:]
        self.decode_steps += new_tokens.shape[1]
        results, ended = self._replies(new_tokens, record.finish(new_tokens[:, -1]), rows_done, max_new_tokens)
        self.row_steps += n * new_tokens.shape[1]
        entries = self._keep(sequences, cached, suffixes, lc, ls, results, out[CACHE_KEY]) if self.reuse_cache else {}
        return results, ended, entries

    def _replies(self, new_tokens, logps, rows_done, max_new_tokens) -> tuple[list, list[bool]]:
        """Each row's reply (ids and logprobs up to its first end-of-turn token or the end ``rows_done`` found) and
        whether it ended: by one of those, or at ``max_new_tokens`` (a row cut by an early end of the call has not)."""
        results, ended = [], []
        eos = set(self.eos_token_ids)
        for i, (row, lp) in enumerate(zip(new_tokens.tolist(), logps.tolist())):
            end = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
            if rows_done is not None:
                end = min(end, rows_done.ends.get(i, end))
            results.append((row[:end], lp[:end]))
            stopped = end < len(row) or (rows_done is not None and i in rows_done.ends) or (row and row[-1] in eos)
            ended.append(bool(stopped) or len(row) >= max_new_tokens)
        return results, ended

    def _sampling_cache(self, kept, cached, capacity, device):
        """One cache for the whole call, allocated once for ``capacity`` positions: each step writes
        its token's keys and values in place (``DynamicCache`` concatenates, copying the cache every
        token). The kept rows are laid out right-aligned, zeros (masked) on their left. Other
        architectures (sliding-window or linear-attention layers) get ``None``: ``generate`` builds the
        cache their config asks for."""
        from transformers import DynamicCache

        if not self.full_attention:
            return None
        past = DynamicCache()
        past.layer_class_to_replicate = functools.partial(_CallLayer, capacity)
        lc = max(cached)
        if lc > 0:
            for layer, (k0, v0) in enumerate(next(k for k in kept if k is not None)[1]):
                lay = past.layer_class_to_replicate()
                lay.allocate(len(kept), k0, v0, device)
                for i, (entry, c) in enumerate(zip(kept, cached)):
                    if entry is not None:
                        lay.key_buffer[i, :, lc - c : lc], lay.value_buffer[i, :, lc - c : lc] = entry[1][layer]
                lay.advance(lc)
                past.layers.append(lay)
        return past

    def _share_prompts(self, sequences, kept, device) -> list:
        """Identical new sequences (a group's ``num_generations`` copies of one start state) are read once.

        The keys and values of each distinct sequence but its last token come from one forward pass
        (left-padded, positions counted from each row's first token); every copy then starts from
        them as from a kept entry, feeding only its last token."""
        rows: dict[tuple, list[int]] = {}
        for i, (seq, entry) in enumerate(zip(sequences, kept)):
            if entry is None and len(seq) > 1:
                rows.setdefault(tuple(seq), []).append(i)
        shared = [seq for seq, members in rows.items() if len(members) > 1]
        if not shared:
            return kept
        width = max(len(seq) - 1 for seq in shared)
        input_ids = torch.full((len(shared), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(shared), width), dtype=torch.long)
        for r, seq in enumerate(shared):
            input_ids[r, width - len(seq) + 1 :] = torch.tensor(seq[:-1], dtype=torch.long)
            attention_mask[r, width - len(seq) + 1 :] = 1
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        was_training = self.model.training
        self.model.eval()
        out = self.model(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            position_ids=position_ids.to(device),
            use_cache=True,
        )
        if was_training:
            self.model.train()
        self.prefill_tokens += sum(len(seq) - 1 for seq in shared)
        layers = [(layer.keys, layer.values) for layer in out[CACHE_KEY].layers]
        kept = list(kept)
        for r, seq in enumerate(shared):
            start = width - len(seq) + 1
            entry = (list(seq[:-1]), [(k[r, :, start:], v[r, :, start:]) for k, v in layers])
            for i in rows[seq]:
                kept[i] = entry
        return kept

    def _keep(self, sequences, cached, suffixes, lc, ls, results, cache) -> dict:
        """Each row's own keys and values (its history and its reply but the last token), contiguous:
        ``{row: (tokens, per-layer (keys, values))}`` for the rows with a reply.

        Layer by layer, each layer of the sampling cache released once copied, so the keys and
        values are never held twice."""
        rows = [i for i, (ids, _) in enumerate(results) if ids]
        spans = {
            i: [
                (lc - cached[i], lc),
                (lc + ls - len(suffixes[i]), lc + ls),
                (lc + ls, lc + ls + len(results[i][0]) - 1),
            ]
            for i in rows
        }
        layers = {i: [] for i in rows}
        for layer in cache.layers:
            k, v = layer.keys, layer.values
            for i in rows:
                layers[i].append(
                    (
                        torch.cat([k[i, :, a:b] for a, b in spans[i]], dim=1),
                        torch.cat([v[i, :, a:b] for a, b in spans[i]], dim=1),
                    )
                )
            layer.free()
            k = v = None
        return {i: (list(sequences[i]) + results[i][0][:-1], layers[i]) for i in rows}


class _CallLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in buffers allocated once for the call's full
    length (history, new tokens and the reply's token limit): ``update`` writes the new positions in
    place and exposes the filled part as a view, where ``DynamicLayer`` concatenates (copying the
    whole cache for every sampled token: per step, work that grows with rows x history).
    The buffers start at zero, so a masked gap never holds a non-finite value."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0
        self.key_buffer = self.value_buffer = None

    def allocate(self, batch: int, keys: torch.Tensor, values: torch.Tensor, device) -> None:
        """Buffers for ``batch`` rows shaped like one row's ``keys`` / ``values`` (heads, length, dim)."""
        self.device = device
        self.key_buffer = keys.new_zeros((batch, keys.shape[-3], self.capacity, keys.shape[-1]), device=device)
        self.value_buffer = values.new_zeros((batch, values.shape[-3], self.capacity, values.shape[-1]), device=device)
        self.is_initialized = True

    def advance(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise RuntimeError(f"cache of {self.capacity} positions asked for {self.length + n}")
        self.length += n
        self.keys = self.key_buffer[:, :, : self.length]
        self.values = self.value_buffer[:, :, : self.length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.allocate(key_states.shape[0], key_states[0], value_states[0], key_states.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, n = self.length, key_states.shape[-2]
        self.advance(n)  # checks the room first
        self.key_buffer[:, :, start : start + n] = key_states
        self.value_buffer[:, :, start : start + n] = value_states
        return self.keys, self.values

    def free(self) -> None:
        self.keys = self.values = self.key_buffer = self.value_buffer = None

    def reset(self) -> None:
        self.free()
        self.length, self.is_initialized = 0, False


class _RowsDone:
    """A stopping criterion: row ``i`` is done once ``done(i, its new tokens)`` holds (``done`` may be None: end-of-turn
    tokens only) or it wrote an end-of-turn token (``ends[i]``: its reply's length then). ``generate`` pads a done
    row from there on and stops when all are, so a batch whose replies all hit a stop string is not sampled on to
    the token limit, and the reply kept (with its cache) is exactly the cut one. ``early_until`` (a token count):
    the call also ends, for every row, once ``drop_share`` of the rows or more are done (at least one), while no
    more tokens than that have been sampled (the rows not done go on in another call)."""

    def __init__(
        self, done, start: int, eos_token_ids: list[int], *, early_until: int | None = None, drop_share: float = 0.0
    ):
        self.done, self.start, self.eos = done, start, set(eos_token_ids)
        self.early_until, self.drop_share = early_until, drop_share
        self.ends: dict[int, int] = {}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        rows = input_ids[:, self.start :].tolist()
        for i, row in enumerate(rows):
            if i not in self.ends and (row[-1] in self.eos or (self.done is not None and self.done(i, row))):
                self.ends[i] = len(row)
        n = len(rows)
        if (
            self.early_until is not None
            and len(self.ends) >= max(1.0, self.drop_share * n)
            and n > len(self.ends)
            and len(rows[0]) <= self.early_until
        ):
            return torch.ones(n, dtype=torch.bool, device=input_ids.device)
        return torch.tensor([i in self.ends for i in range(n)], device=input_ids.device)


class _Continued:
    """``done`` for a call whose row ``k`` is the generate call's row ``rows[k]``, whose reply so far is
    ``replies[rows[k]]``: the engine's rule is applied to the whole reply."""

    def __init__(self, done, rows: list[int], replies: list[tuple[list[int], list[float]]]):
        self.done, self.rows, self.replies = done, list(rows), replies

    def __call__(self, k: int, ids: list[int]) -> bool:
        i = self.rows[k]
        return self.done(i, self.replies[i][0] + ids)


class _SampledLogprobs:
    """A logits processor that records ``log_softmax(logits / T)`` of each sampled token without
    keeping every step's logits: at step t it sees the token drawn at step t-1 and reads its
    logprob from the one distribution it kept (batch x vocab, not batch x steps x vocab: 13 GB for
    256 replies of 256 tokens over a 49k vocabulary). Custom processors run before the temperature
    warper, so ``scores`` are the raw logits here (every other processor is neutral)."""

    def __init__(self, scale: float):
        self.scale, self.previous, self.steps = scale, None, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, input_ids[:, -1:].to(self.previous.device)).squeeze(1))
        self.previous = torch.log_softmax(scores.float() / self.scale, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(B, new tokens) logprobs, given the tokens drawn at the last step."""
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, last_tokens[:, None].to(self.previous.device)).squeeze(1))
            self.previous = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(len(last_tokens), 0)


def _full_attention(model) -> bool:
    """Only caches of plain full-attention layers are laid out and cut here (no sliding windows)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    types = getattr(config, "layer_types", None) or ["full_attention"]
    return all(t == "full_attention" for t in types) and not getattr(config, "use_sliding_window", False)
