"""Throughput against this machine's own limit: model FLOPs utilisation (MFU) of rollout decoding and of the
training step, for the tiny model and SmolLM2-135M-Instruct (when built: ``make model``), HF backend.

    python benchmarks/utilisation.py           # stores the "utilisation" section of results.json
    python benchmarks/utilisation.py --quick   # one repeat, smaller shapes, the tiny model only; stores nothing
    python benchmarks/utilisation.py checkpointing   # only the training step, activation checkpointing on and off
    python benchmarks/utilisation.py padding         # only the training step, micro-batches cut to their own width
    python benchmarks/utilisation.py finished        # only the rollout, finished rows carried and dropped
    python benchmarks/utilisation.py decode          # only decode steps, split by where their time goes

- peak: the FLOP/s of one large square fp32 matmul (2,048 cubed) with the threads torch uses: the machine's
  limit, which every MFU is measured against. Beside it, the rate of the model's own weight shapes (``F.linear``
  of an ``M x K`` input with each ``N x K`` weight: q/k/v/o, gate/up/down, the LM head) at ``M`` from 1 to 4,096
  rows: the ceiling of a decode step over ``M`` sequences (the gap to the peak: the "small matmul" loss).
- prefill: ``HFBackend.generate`` of one token on distinct prompts. decode: a later turn as the rollout engine
  makes it: rows whose history is already in the backend's kept cache, continued by ``new`` tokens in one
  ``generate`` call (no end-of-turn stop), once plain and once with the engine's per-step reply check. Model
  FLOPs: ``2 x`` the weights every token passes (each linear layer, the LM head) plus attention's
  ``4 x layers x heads x head_dim x context`` per token (half of it for the causal prefill). MFU = model FLOPs /
  seconds / peak. Split of a step: the time its linear layers take at the measured rate for that many rows
  (``step_matmul_share``), the check's share, and the rest (attention, sampling, the Python of each step).
- train: forward and backward of the model (cross-entropy on every token) over a micro-batch of ``rows x
  length`` tokens, as a training step's inner loop does: ``6 x`` the weight FLOPs per token plus attention's
  ``12 x layers x heads x head_dim x length / 2`` (causal). With ``pad``: the same micro-batch where half the
  rows are real tokens for only a quarter of the length (the rest padding), as multi-turn episodes of mixed
  length are batched: MFU counted on real tokens only.

- padding: a generation batch split as TRL splits it (shuffled, into micro-batches of ``micro`` rows, every one
  padded to the batch's longest completion), forward and backward of every micro-batch as TRL pads it and as
  ``MultiTurnStarPOTrainer.compute_loss`` cuts it (``trim_completion_padding``: the columns that are padding in
  every row of the micro-batch), side by side in each repeat. Completion lengths are drawn uniformly between
  the two bounds given (not measured rollouts): multi-turn FrozenLake-like (a 192-token first message, replies
  and env messages of 64 to 512 tokens, micro-batches of 2, as ``recipes/smollm2-cpu-frozenlake.yaml``) and
  single-turn Bandit-like (256 and 4 to 64, micro-batches of 8).

- finished: the rollout of ``rollout_episodes`` FrozenLake episodes with the rows whose reply has ended carried to
  the end of each ``generate`` call, and dropped (``HFBackend(drop_finished_rows=True)``, the default: a call ends
  once a quarter of its rows are done, the others go on from their kept cache), side by side in each repeat, same
  seed.

- decode: decode steps of 64 and of 8 rows at 64 to 1,024 cached history tokens; each step's time fitted as a line
  in the history (least squares): the slope is attention over the history (reading its keys and values), and the
  step splits into the linear layers (at the rate measured for that many rows), attention over the history, the
  sampling (log-softmax for the logprobs, softmax and the draw over the vocabulary, timed alone) and the rest.

- threads: the first train and decode shapes with torch's default threads (one per core) and with one, side by
  side in each repeat: what ``train.py --torch_threads 1`` buys a small model.

Every figure is the median of REPEATS (3) runs, with its min and max. Run it alone on the machine: another job on
the same cores changes every figure (and the threads comparison most).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
import warnings

HERE = pathlib.Path(__file__).resolve().parent

import report  # noqa: E402,F401  (records the code's commit as the run starts)

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from starpo_trl.rollout import HFBackend  # noqa: E402

REPEATS = 3
ROWS = (1, 8, 32, 128, 512, 4096)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "repeats": values}


def linear_shapes(model) -> list[tuple[int, int]]:
    """``(N, K)`` of every linear layer a token passes (the LM head included), one entry per layer."""
    return [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)]


def attention_width(model) -> tuple[int, int]:
    """``(layers, heads x head_dim)``: what attention's FLOPs per token of context scale with."""
    cfg = model.config.get_text_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return cfg.num_hidden_layers, cfg.num_attention_heads * head_dim


def timed(fn, repeats: int) -> float:
    """Best wall seconds of one call of ``fn`` over ``repeats`` rounds, after one warm-up call; a call faster
    than 20 ms is repeated within a round and averaged (a lone microsecond-scale call times the clock)."""
    start = time.perf_counter()
    fn()
    inner = max(1, int(0.02 / max(time.perf_counter() - start, 1e-6)))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def matmul_rates(model, rows=ROWS, calls: int = 5) -> dict[int, float]:
    """FLOP/s of the model's distinct weight shapes at each row count ``M``: total FLOPs / total best seconds."""
    shapes = sorted(set(linear_shapes(model)))
    rates = {}
    for m in rows:
        flops = seconds = 0.0
        for n, k in shapes:
            x, w = torch.randn(m, k), torch.randn(n, k)
            seconds += timed(lambda x=x, w=w: F.linear(x, w), calls)
            flops += 2.0 * m * n * k
        rates[m] = flops / seconds
    return rates


def machine_peak(size: int = 2048) -> float:
    """FLOP/s of one large square fp32 matmul (``size`` cubed): the most torch's CPU kernels get out of this
    machine, the limit every MFU below is measured against."""
    x, w = torch.randn(size, size), torch.randn(size, size)
    return 2.0 * size**3 / timed(lambda: F.linear(x, w), 3)


def weight_flops_per_token(model) -> float:
    return 2.0 * sum(n * k for n, k in linear_shapes(model))


def prefill_row(model, tok, rows: int, prompt: int, repeats: int) -> dict:
    """``HFBackend.generate`` of 1 token on ``rows`` distinct random prompts of ``prompt`` tokens: the prefill."""
    torch.manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    prompts = torch.randint(3, vocab, (rows, prompt)).tolist()
    layers, width = attention_width(model)
    flops = rows * prompt * weight_flops_per_token(model) + rows * 2 * layers * width * prompt * prompt  # causal
    seconds = []
    for _ in range(repeats):
        backend = HFBackend(model, tok.pad_token_id, eos_token_ids=[], reuse_cache=False)
        start = time.perf_counter()
        backend.generate(prompts, max_new_tokens=1, temperature=1.0)
        seconds.append(time.perf_counter() - start)
    return {
        "rows": rows,
        "prompt_tokens": prompt,
        "seconds": spread(seconds),
        "gflops": spread([flops / t / 1e9 for t in seconds]),
    }


def decode_row(model, tok, batch: int, history: int, new: int, rates: dict, repeats: int) -> dict:
    """Decode steps as a later turn of a rollout makes them: ``batch`` rows whose ``history`` tokens are already in
    the backend's kept cache (one shared random prompt, read once, then a few sampled tokens each), continued by
    ``new`` tokens each in one ``HFBackend.generate`` call; once plain and once with the engine's per-step check of
    each reply (``done``: its token limit and a stop string that never occurs), so the step's time, its model FLOPs
    and the check's cost are told apart. The kept cache is restored before every timed call."""
    from functools import partial

    from starpo_trl.rollout.engine import _reply_done

    torch.manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    prompt = torch.randint(3, vocab, (history - 8,)).tolist()
    backend = HFBackend(model, tok.pad_token_id, eos_token_ids=[], reuse_cache=True)
    first = backend.generate([prompt] * batch, max_new_tokens=8, temperature=1.0)
    sequences = [prompt + ids + [3] for ids, _ in first]  # each row extends its kept entry by one token
    kept = list(backend._kept)
    layers, width = attention_width(model)
    per_token = weight_flops_per_token(model)
    done = partial(_reply_done, tok, [new] * batch, ("\x00never",))

    def run(check) -> float:
        backend._kept = list(kept)
        start = time.perf_counter()
        out = backend.generate(sequences, max_new_tokens=new, temperature=1.0, done=check)
        assert all(len(ids) == new for ids, _ in out)
        return (time.perf_counter() - start) / new

    plain, checked = [], []
    for _ in range(repeats):
        plain.append(run(None))
        checked.append(run(done))
    step_flops = batch * (per_token + 4 * layers * width * (history + new / 2))
    rate = rates[min(rates, key=lambda m: abs(m - batch))]  # the matmul rate at this many rows
    return {
        "batch": batch,
        "history_tokens": history,
        "new_tokens": new,
        "step_seconds": spread(plain),
        "step_gflops": spread([step_flops / t / 1e9 for t in plain]),
        "step_matmul_share": batch * per_token / rate / statistics.median(plain),
        "step_seconds_with_check": spread(checked),
        "check_share": 1 - statistics.median(plain) / statistics.median(checked),
        "tokens_per_second": spread([batch / t for t in plain]),
    }


def sampling_seconds(rows: int, vocab: int, repeats: int) -> float:
    """One decode step's sampling work on ``rows x vocab`` logits, as ``HFBackend`` does it: the logprob record's
    float log-softmax (and the gather of the previous step's token), then ``generate``'s temperature, softmax and
    multinomial draw."""
    from starpo_trl.rollout.hf_backend import _SampledLogprobs

    torch.manual_seed(0)
    logits, ids = torch.randn(rows, vocab), torch.randint(0, vocab, (rows, 1))
    record = _SampledLogprobs(1.0)

    def step() -> None:
        scores = record(ids, logits)
        torch.multinomial(torch.softmax(scores / 0.7, dim=-1), 1)

    return timed(step, repeats)


def decode_split_row(model, tok, batch: int, histories: tuple[int, ...], new: int, rates: dict, repeats: int) -> dict:
    """Decode steps of ``batch`` rows (``decode_row``) at each cached history length, and where a step's time goes.
    The step time against the mean context of the call's steps, fitted by least squares: the slope is what each
    cached token costs a step (attention reading its keys and values, the mask over it), the intercept the part
    that does not grow with the history. Beside them, the linear layers' time at the rate this machine reaches for
    ``batch`` rows and the sampling's (``sampling_seconds``); the rest is the fixed part's remainder (norms, rotary
    embeddings, the mask and cache bookkeeping, the Python of each step)."""
    rows = [decode_row(model, tok, batch, h, new, rates, repeats) for h in histories]
    xs = [h + new / 2 for h in histories]
    ys = [r["step_seconds"]["median"] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    rate = rates[min(rates, key=lambda m: abs(m - batch))]
    linear = batch * weight_flops_per_token(model) / rate
    sampling = sampling_seconds(batch, model.config.get_text_config().vocab_size, repeats)
    split = {}
    for h, x, y in zip(histories, xs, ys):
        shares = {"linear": linear / y, "history": slope * x / y, "sampling": sampling / y}
        split[str(h)] = {"step_seconds": y, **{f"{k}_share": v for k, v in shares.items()}}
        split[str(h)]["rest_share"] = 1 - sum(shares.values())
    return {
        "batch": batch,
        "new_tokens": new,
        "decode": rows,
        "seconds_per_history_token": slope,
        "fixed_seconds": my - slope * mx,
        "linear_seconds": linear,
        "sampling_seconds": sampling,
        "split": split,
    }


def train_row(model, rows: int, length: int, real_length: int | None, repeats: int) -> dict:
    """Forward + backward (cross-entropy on the real tokens) of a ``rows x length`` micro-batch; ``real_length``:
    half of the rows hold only that many real tokens (the rest is padding). FLOPs counted on real tokens."""
    torch.manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(3, vocab, (rows, length))
    mask = torch.ones(rows, length, dtype=torch.long)
    if real_length is not None:
        mask[: rows // 2, real_length:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    layers, width = attention_width(model)
    lengths = mask.sum(1).tolist()
    per_token = weight_flops_per_token(model)  # walks the modules once, not once per row
    flops = sum(n * (3 * per_token + 6 * layers * width * n) for n in lengths)
    was_training = model.training
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()

    seconds = []
    try:
        for _ in range(repeats):
            seconds.append(timed(step, 1))
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return {
        "rows": rows,
        "length": length,
        "real_tokens": sum(lengths),
        "padded_tokens": rows * length,
        "seconds": spread(seconds),
        "gflops": spread([flops / s / 1e9 for s in seconds]),
    }


def checkpointing_row(model, rows: int, length: int, repeats: int) -> dict:
    """The training step's forward + backward with activation checkpointing on (TRL's configs turn it on by
    default: each layer's forward runs again during the backward pass, with TRL's ``use_reentrant=False``) and off,
    side by side in each repeat: seconds each and the speedup of turning it off (on / off) per repeat. The
    gradients are the same either way (``tests/test_pipeline.py`` checks the weights a warm start gives)."""
    out = {"rows": rows, "length": length, "on": [], "off": []}
    try:
        for _ in range(repeats):
            for key in ("on", "off"):
                if key == "on":
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                else:
                    model.gradient_checkpointing_disable()
                out[key].append(train_row(model, rows, length, None, 1)["seconds"]["median"])
    finally:
        model.gradient_checkpointing_disable()
    out["off_speedup"] = spread([a / b for a, b in zip(out["on"], out["off"])])
    return out


def padding_row(model, rows: int, micro: int, prompt: int, lengths: tuple[int, int], repeats: int) -> dict:
    """Seconds of the forward + backward passes over one generation batch of ``rows`` episodes, uncut and cut to
    each micro-batch's width, side by side per repeat (see the module docstring), and the speedup per repeat."""
    from starpo_trl.rollout.batch import trim_completion_padding

    torch.manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    real = torch.randint(lengths[0], lengths[1] + 1, (rows,))
    width = int(real.max())
    mask = (torch.arange(width)[None, :] < real[:, None]).long()
    batch = {
        "prompt_ids": torch.randint(3, vocab, (rows, prompt)),
        "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab, (rows, width)) * mask,
        "completion_mask": mask,
    }
    order = torch.randperm(rows)  # TRL shuffles the generation batch, then splits it
    parts = [{k: v[order[i : i + micro]] for k, v in batch.items()} for i in range(0, rows, micro)]
    was_training = model.training
    model.train()

    def step(part) -> None:
        ids = torch.cat([part["prompt_ids"], part["completion_ids"]], 1)
        attention = torch.cat([part["prompt_mask"], part["completion_mask"]], 1)
        n = part["completion_ids"].size(1)
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=n + 1).logits[:, :-1]
        labels = part["completion_ids"].masked_fill(part["completion_mask"] == 0, -100)
        F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1)).backward()

    out = {"rows": rows, "micro": micro, "prompt": prompt, "lengths": list(lengths), "uncut": [], "cut": []}
    out["padded_columns"] = len(parts) * width
    out["cut_columns"] = sum(trim_completion_padding(p)["completion_ids"].size(1) for p in parts)
    try:
        for _ in range(repeats):
            for key in ("uncut", "cut"):
                cut = key == "cut"
                start = time.perf_counter()
                for part in parts:
                    model.zero_grad(set_to_none=True)
                    step(trim_completion_padding(part) if cut else part)
                out[key].append(time.perf_counter() - start)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    out["cut_speedup"] = spread([a / b for a, b in zip(out["uncut"], out["cut"])])
    return out


def lake_rollout(model, tok, episodes: int, seed: int, **backend_kw) -> tuple[float, HFBackend, list]:
    """``episodes`` FrozenLake episodes (4 start states x their copies, 3 turns, replies opened with ``<answer>`` and
    stopped at ``</answer>`` or 48 tokens, temperature 1) through ``RolloutEngine`` and ``HFBackend(**backend_kw)``:
    seconds, the backend (its counters) and the episodes."""
    from starpo_trl.models import eos_token_ids
    from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState

    cfg = RolloutConfig(
        max_turns=3,
        max_tokens_per_turn=48,
        enable_think=False,
        reply_prefix="auto",
        stop_strings=["</answer>"],
    )
    eos = eos_token_ids(tok, model.generation_config.eos_token_id)
    starts = [StartState("starpo/FrozenLake-v0", i % 4, (("is_slippery", False),)) for i in range(episodes)]
    torch.manual_seed(seed)
    backend = HFBackend(model, tok.pad_token_id, eos, **backend_kw)
    engine = RolloutEngine(tok, backend, cfg, eos)
    start = time.perf_counter()
    played = engine.run(starts, 1.0)
    seconds = time.perf_counter() - start
    engine.close()
    return seconds, backend, played


def rollout_row(model, tok, episodes: int, repeats: int) -> dict:
    """A rollout as training plays it (``lake_rollout``). Model FLOPs of its linear layers (the tokens read and the
    reply tokens kept) per second; and the finished-row share: the part of the decode work (rows x sampling steps)
    spent on rows whose reply had already ended, which the batch carries until its last reply ends (or, with
    ``drop_finished_rows``, until a quarter of its rows have ended)."""
    per_token = weight_flops_per_token(model)
    seconds, flops, finished, turns = [], [], [], []
    for repeat in range(repeats):
        took, backend, played = lake_rollout(model, tok, episodes, repeat)
        seconds.append(took)
        flops.append((backend.prefill_tokens + backend.reply_tokens) * per_token)
        finished.append(1 - backend.reply_tokens / backend.row_steps)
        turns.append(sum(ep.num_turns for ep in played) / len(played))
    return {
        "episodes": episodes,
        "seconds": spread(seconds),
        "gflops": spread([f / t / 1e9 for f, t in zip(flops, seconds)]),
        "finished_row_share": spread(finished),
        "turns_per_episode": statistics.median(turns),
    }


def finished_rows_row(model, tok, episodes: int, repeats: int) -> dict:
    """The same rollout (``lake_rollout``, same seed) with finished rows carried to the end of each call and with
    them dropped (``drop_finished_rows``), side by side in each repeat (which goes first alternates): seconds,
    rows x sampling steps, the finished-row share, and the speedup of dropping them."""
    out = {"episodes": episodes, "carried": [], "dropped": [], "row_steps": {"carried": [], "dropped": []}}
    share = {"carried": [], "dropped": []}
    for repeat in range(repeats):
        order = ("carried", "dropped") if repeat % 2 == 0 else ("dropped", "carried")
        for key in order:
            took, backend, _ = lake_rollout(model, tok, episodes, repeat, drop_finished_rows=key == "dropped")
            out[key].append(took)
            out["row_steps"][key].append(backend.row_steps)
            share[key].append(1 - backend.reply_tokens / backend.row_steps)
    out["finished_row_share"] = {k: spread(v) for k, v in share.items()}
    out["dropped_speedup"] = spread([a / b for a, b in zip(out["carried"], out["dropped"])])
    return out


def threads_row(model, tok, shapes: dict, repeats: int) -> dict:
    """The first train and decode shapes with torch's default threads and with one, side by side in each repeat:
    seconds each and the speedup of one thread (default seconds / one-thread seconds) per repeat."""
    default = torch.get_num_threads()
    rows, length, real = shapes["train"][0]
    batch, history, new = shapes["decode"][0]
    out = {"default_threads": default, "train": {"default": [], "one": []}, "decode_step": {"default": [], "one": []}}
    try:
        for _ in range(repeats):
            for key, n in (("default", default), ("one", 1)):
                torch.set_num_threads(n)
                out["train"][key].append(train_row(model, rows, length, real, 1)["seconds"]["median"])
                step = decode_row(model, tok, batch, history, new, {batch: 1.0}, 1)
                out["decode_step"][key].append(step["step_seconds"]["median"])
    finally:
        torch.set_num_threads(default)
    for part in ("train", "decode_step"):
        d = out[part]
        d["one_thread_speedup"] = spread([a / b for a, b in zip(d["default"], d["one"])])
    return out


def measure(name: str, model, tok, shapes: dict, repeats: int) -> dict:
    """One model's peak, decode and train rows, MFU against its own peak."""
    model.float()
    rates = matmul_rates(model, shapes["rows"])
    peak = machine_peak(shapes["peak_size"])
    out = {
        "threads": torch.get_num_threads(),
        "weights_mflop_per_token": weight_flops_per_token(model) / 1e6,
        "peak_gflops": peak / 1e9,
        "own_shapes_best_gflops": max(rates.values()) / 1e9,
        "matmul_gflops_by_rows": {str(m): r / 1e9 for m, r in rates.items()},
        "decode": [],
        "train": [],
    }
    rows, prompt = shapes["prefill"]
    row = prefill_row(model, tok, rows, prompt, repeats)
    row["mfu"] = spread([g * 1e9 / peak for g in row["gflops"]["repeats"]])
    out["prefill"] = row
    print(name, f"prefill {rows} x {prompt}: MFU {row['mfu']['median']:.3f}", flush=True)
    for batch, history, new in shapes["decode"]:
        row = decode_row(model, tok, batch, history, new, rates, repeats)
        row["step_mfu"] = spread([g * 1e9 / peak for g in row["step_gflops"]["repeats"]])
        out["decode"].append(row)
        print(
            name,
            f"decode {batch} rows, {history} cached + {new}: step MFU {row['step_mfu']['median']:.3f} "
            f"(linear layers at this row count: {row['step_matmul_share']:.2f} of the step; the per-step check "
            f"{row['check_share']:.2f})",
            flush=True,
        )
    row = rollout_row(model, tok, shapes["rollout_episodes"], repeats)
    row["mfu"] = spread([g * 1e9 / peak for g in row["gflops"]["repeats"]])
    out["rollout"] = row
    print(
        name,
        f"rollout of {row['episodes']} episodes: MFU {row['mfu']['median']:.3f}, finished-row share "
        f"{row['finished_row_share']['median']:.2f}",
        flush=True,
    )
    out["threads"] = threads_row(model, tok, shapes, repeats)
    t = out["threads"]
    print(
        name,
        f"one thread against {t['default_threads']}: train x{t['train']['one_thread_speedup']['median']:.2f}, "
        f"decode step x{t['decode_step']['one_thread_speedup']['median']:.2f}",
        flush=True,
    )
    for rows, length, real in shapes["train"]:
        row = train_row(model, rows, length, real, repeats)
        row["mfu"] = spread([g * 1e9 / peak for g in row["gflops"]["repeats"]])
        out["train"].append(row)
        print(name, f"train {rows} x {length} (real {real}): MFU {row['mfu']['median']:.3f}", flush=True)
    return out


def models(quick: bool):
    from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    yield "tiny", build_tiny_model(tok), tok
    if quick:
        return
    from speed import offline_smollm2

    loaded = offline_smollm2()
    if loaded is not None:
        model, tok = loaded
        yield "SmolLM2-135M-Instruct", model, tok


SHAPES = {
    "rows": ROWS,
    "peak_size": 2048,
    "rollout_episodes": 32,
    "prefill": (4, 256),  # (rows, prompt tokens)
    # (rows, cached history tokens, new tokens): a later turn of a rollout of 64 episodes, and of 8
    "decode": [(64, 512, 16), (8, 512, 16)],
    # (rows, length, real length of half the rows): a micro-batch of 4 whole episodes, then half of them short
    "train": [(4, 256, None), (4, 256, 64)],
    # name: (rows, micro-batch rows, prompt tokens, (shortest, longest) completion)
    "padding": {"FrozenLake-like": (32, 2, 192, (64, 512)), "Bandit-like": (32, 8, 256, (4, 64))},
    # (rows, cached history lengths, new tokens): decode steps split by where their time goes
    "decode_split": [(64, (64, 256, 512, 1024), 16), (8, (64, 256, 512, 1024), 16)],
}
QUICK = {
    "rows": (1, 64, 512),
    "peak_size": 1024,
    "rollout_episodes": 8,
    "prefill": (4, 64),
    "decode": [(8, 64, 8)],
    "train": [(4, 128, None)],
    "padding": {"FrozenLake-like": (8, 2, 32, (8, 64))},
    "decode_split": [(8, (16, 64), 8)],
}


def checkpointing_part(model, tok, shapes: dict, repeats: int) -> tuple[dict, str]:
    rows, length, _ = shapes["train"][0]
    row = checkpointing_row(model, rows, length, repeats)
    return row, f"train {rows} x {length}: checkpointing off x{row['off_speedup']['median']:.2f}"


def padding_part(model, tok, shapes: dict, repeats: int) -> tuple[dict, str]:
    rows = {k: padding_row(model, *v, repeats) for k, v in shapes["padding"].items()}
    return rows, ", ".join(f"{k}: cut to own width x{row['cut_speedup']['median']:.2f}" for k, row in rows.items())


def finished_part(model, tok, shapes: dict, repeats: int) -> tuple[dict, str]:
    row = finished_rows_row(model, tok, shapes["rollout_episodes"], repeats)
    return row, f"rollout, finished rows dropped x{row['dropped_speedup']['median']:.2f}"


def decode_part(model, tok, shapes: dict, repeats: int) -> tuple[list, str]:
    rates = matmul_rates(model, shapes["rows"])
    rows = [decode_split_row(model, tok, *x, rates, repeats) for x in shapes["decode_split"]]
    longest = [(row["batch"], row["split"][max(row["split"], key=int)]) for row in rows]
    return rows, "; ".join(f"{b} rows: " + str({k: round(v, 3) for k, v in s.items()}) for b, s in longest)


# part -> (results section, what it measures per model, the shapes it stores, seeds stored: one per repeat or [0])
PARTS = {
    "checkpointing": ("activation_checkpointing", checkpointing_part, None, False),
    "padding": ("micro_batch_padding", padding_part, "padding", False),
    "finished": ("finished_rows", finished_part, None, True),
    "decode": ("decode_split", decode_part, "decode_split", False),
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one repeat, small shapes, the tiny model; stores nothing")
    p.add_argument(
        "part",
        nargs="?",
        default="all",
        choices=["all", *PARTS],
        help="checkpointing: only the training step with activation checkpointing on and off (section "
        "activation_checkpointing); padding: only the training step with micro-batches uncut and cut to their "
        "own width (section micro_batch_padding); finished: only the rollout, finished rows carried and dropped "
        "(section finished_rows); decode: only decode steps at several cached history lengths, split into "
        "linear layers, attention over the history, sampling and the rest (section decode_split)",
    )
    p.add_argument("--note", help="stored with the section, e.g. what else ran on the machine")
    a = p.parse_args(argv)
    note = {"note": a.note} if a.note else {}
    start = time.time()
    shapes, repeats = (QUICK, 1) if a.quick else (SHAPES, REPEATS)
    if a.part in PARTS:
        section, run, stored_shapes, seed_per_repeat = PARTS[a.part]
        per_model = {}
        for name, model, tok in models(a.quick):
            model.float()
            per_model[name], line = run(model, tok, shapes, repeats)
            print(name, line, flush=True)
        extra = {"shapes": shapes[stored_shapes]} if stored_shapes else {}
        if not a.quick:
            report.store(
                section,
                {"per_model": per_model, **extra, **note},
                seeds=list(range(repeats)) if seed_per_repeat else [0],
                wall_seconds=time.time() - start,
            )
        return
    per_model = {name: measure(name, model, tok, shapes, repeats) for name, model, tok in models(a.quick)}
    if a.quick:
        return
    report.store(
        "utilisation", {"per_model": per_model, "shapes": SHAPES, **note}, seeds=[0], wall_seconds=time.time() - start
    )


if __name__ == "__main__":
    main()
