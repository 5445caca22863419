"""Speed of the episode engine and of a training step, as ratios measured side by side in one run.

    python benchmarks/speed.py         # stores the rows in benchmarks/results.json and BENCHMARKS.md
    python benchmarks/speed.py engine  # only the "speed" section (not the MI pass below)

Every ratio is the median of REPEATS (3) side-by-side repeats; each repeat's ratio is stored too
(``<key>_repeats``) and BENCHMARKS.md shows the spread.

- rollout_overhead_ratio: the engine playing 32 Sokoban episodes x 5 turns, divided by the bare
  ``model.generate`` calls on exactly the same token inputs (recorded, then replayed with the same
  RNG state). Target <= 1.10.
- batched_vs_sequential_speedup: the same 32 episodes one at a time vs batched per turn. Target >= 5.
- step_time_ratio_vs_trl_grpo: one step of MultiTurnStarPOTrainer on single-turn Bandit vs stock
  trl.GRPOTrainer on the same prompt, group size, completion length and model (the reward
  function parses the same answer). Target <= 1.15.
- prefill tokens per turn: tokens the model reads before sampling at each turn, with the HF
  backend's KV reuse across turns (only what was appended) and without it (the whole history).
- kv_reuse_speedup: the same 32 episodes (same RNG) with KV reuse off / on; on the tiny model and,
  when it has been built (``make model``), on SmolLM2-135M-Instruct (8 episodes x 3 turns).
- peak RSS of a shortened CPU demo run (a separate process).

    python benchmarks/speed.py mi   # only the MI pass (the "mi_pass" section)

- mi_pass_speedup: the MI collapse metrics' cross log-probability pass reading each input once and
  sharing its key-value cache over the reasonings, vs reading every (input, reasoning) concatenation
  whole: same sample (8 inputs of 600 tokens, 16 reasonings of 12: the shape of a uniform-turn
  FrozenLake pass), same batch size, on SmolLM2-135M-Instruct when it has been built (``make model``),
  else the tiny model; the largest score difference between the two is reported beside it.
"""

from __future__ import annotations

import json
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = pathlib.Path(__file__).resolve().parent

import report  # noqa: E402,F401  (records the code's commit as the run starts)

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from starpo_trl.models import eos_token_ids  # noqa: E402
from starpo_trl.rollout import HFBackend, RolloutConfig, RolloutEngine, StartState  # noqa: E402
from starpo_trl.rollout.hf_backend import sampling_config  # noqa: E402
from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer  # noqa: E402

REPEATS = 3


class Recording:
    """Wraps a backend: records each call's inputs and the time spent inside it."""

    def __init__(self, inner):
        self.inner, self.calls, self.seconds, self.read = inner, [], 0.0, []

    def reset(self):
        self.inner.reset()

    def generate(self, sequences, max_new_tokens, temperature):
        self.calls.append(([list(s) for s in sequences], max_new_tokens, temperature, torch.get_rng_state()))
        read = self.inner.prefill_tokens
        start = time.perf_counter()
        out = self.inner.generate(sequences, max_new_tokens, temperature)
        self.seconds += time.perf_counter() - start
        self.read.append(self.inner.prefill_tokens - read)
        return out


def bare_generate_seconds(model, tok, calls) -> float:
    """Replay the recorded calls with plain model.generate (inputs padded before the clock starts),
    sampling from the same plain softmax as the engine (``sampling_config``) but without its logprob
    recording, KV reuse or prompt sharing."""
    eos, pad = _ids(model, tok)
    total = 0.0
    for sequences, max_new, temperature, rng in calls:
        width = max(map(len, sequences))
        ids = torch.full((len(sequences), width), pad)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(sequences):
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
        config = sampling_config(max_new, temperature, eos, pad)
        torch.set_rng_state(rng)
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        total += time.perf_counter() - start
    return total


def _ids(model, tok) -> tuple[list[int], int]:
    """The ids that end a turn and the padding id, as train.py and evaluate.py take them."""
    return eos_token_ids(tok, model.generation_config.eos_token_id), (
        tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    )


SOKOBAN_STARTS = [StartState("starpo/Sokoban-v0", s) for s in range(8) for _ in range(4)]
SOKOBAN_ROLLOUT = RolloutConfig(max_turns=5, max_tokens_per_turn=24)


def rollout_rows(model, tok, repeats: int = REPEATS, sequential: bool = True) -> dict:
    """32 Sokoban episodes x 5 turns (8 start states x 4): engine vs bare generate, KV reuse, prefill."""
    eos, pad = _ids(model, tok)
    cfg, starts = SOKOBAN_ROLLOUT, SOKOBAN_STARTS
    ratios, speedups, prefill, walls = [], [], None, []
    RolloutEngine(tok, HFBackend(model, pad, eos), cfg, eos).run(starts[:4])  # warm-up
    reuse, seconds = kv_reuse_speedup(model, tok, starts, cfg, repeats)
    for rep in range(repeats):
        rec = Recording(HFBackend(model, pad, eos))
        engine = RolloutEngine(tok, rec, cfg, eos)
        torch.manual_seed(rep)
        start = time.perf_counter()
        episodes = engine.run(starts)
        engine_s = time.perf_counter() - start
        bare_s = bare_generate_seconds(model, tok, rec.calls)
        ratios.append(engine_s / bare_s)
        walls.append((engine_s, bare_s))
        prefill = [sum(map(len, seqs)) / len(seqs) for seqs, *_ in rec.calls]
        read = [r / len(seqs) for r, (seqs, *_) in zip(rec.read, rec.calls)]
        line = f"rollout rep {rep}: engine {engine_s:.2f}s, bare generate {bare_s:.2f}s"
        if sequential:
            seq_engine = RolloutEngine(tok, HFBackend(model, pad, eos), cfg, eos)
            torch.manual_seed(rep)
            start = time.perf_counter()
            for s in starts:
                seq_engine.run([s])
            speedups.append((time.perf_counter() - start) / engine_s)
            line += f", sequential x{speedups[-1]:.1f}"
        print(f"{line}, turns {max(e.num_turns for e in episodes)}", flush=True)
    rows = {
        "rollout_overhead_ratio": statistics.median(ratios),
        "rollout_overhead_ratio_repeats": [round(x, 4) for x in ratios],
        "kv_reuse_speedup": reuse,
        "kv_reuse_speedup_repeats": [round(s[False] / s[True], 4) for s in seconds],
        "rollout_seconds": {
            "kv_reuse_off": round(statistics.median([s[False] for s in seconds]), 2),
            "kv_reuse_on": round(statistics.median([s[True] for s in seconds]), 2),
            "bare_generate": round(statistics.median([b for _, b in walls]), 2),
        },
        "prefill_tokens_per_episode_by_turn": [round(p, 1) for p in prefill],
        "prefill_tokens_per_episode_by_turn_kv_reuse": [round(p, 1) for p in read],
    }
    if sequential:
        rows["batched_vs_sequential_speedup"] = statistics.median(speedups)
        rows["batched_vs_sequential_speedup_repeats"] = [round(x, 4) for x in speedups]
    return rows


def kv_reuse_speedup(model, tok, starts, cfg, repeats: int = REPEATS) -> tuple[float, list[dict]]:
    """Engine seconds without / with KV reuse across turns, same episodes (same RNG): the median
    ratio of the repeats, and each repeat's seconds."""
    eos, pad = _ids(model, tok)
    ratios, runs = [], []
    for rep in range(repeats):
        seconds = {}
        for reuse in (False, True):
            engine = RolloutEngine(tok, HFBackend(model, pad, eos, reuse_cache=reuse), cfg, eos)
            torch.manual_seed(rep)
            start = time.perf_counter()
            engine.run(starts)
            seconds[reuse] = time.perf_counter() - start
        ratios.append(seconds[False] / seconds[True])
        runs.append(seconds)
        print(f"kv reuse rep {rep}: off {seconds[False]:.2f}s, on {seconds[True]:.2f}s", flush=True)
    return statistics.median(ratios), runs


def offline_smollm2():
    """SmolLM2-135M-Instruct's (model, tokenizer) when it has been built (``make model``), else None."""
    from starpo_trl.offline_model import DEFAULT_DIR, is_built

    if not is_built(DEFAULT_DIR):
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32), AutoTokenizer.from_pretrained(
        DEFAULT_DIR
    )


def real_model_kv_reuse() -> dict:
    loaded = offline_smollm2()
    if loaded is None:
        return {}
    model, tok = loaded
    starts = [StartState("starpo/FrozenLake-v0", s, (("is_slippery", False),)) for s in range(8)]
    ratio, seconds = kv_reuse_speedup(model, tok, starts, RolloutConfig(max_turns=3, max_tokens_per_turn=24))
    return {
        "kv_reuse_speedup_smollm2": ratio,
        "kv_reuse_speedup_smollm2_repeats": [round(s[False] / s[True], 4) for s in seconds],
    }


def step_time_rows(
    tok, make_model, batch: int = 16, generations: int = 8, steps: int = 6, repeats: int = REPEATS
) -> dict:
    """One step of each trainer (median over ``steps`` - 1: the first warms up) per model token, side by
    side ``repeats`` times (which trainer runs first alternates); the ratio is the median of the repeats'.
    ``make_model()`` builds a fresh copy of the model for each trainer."""
    import gymnasium as gym
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from starpo_trl import MultiTurnStarPOTrainer, StarPOConfig
    from starpo_trl.rollout import ChatFormat
    from starpo_trl.rollout.prompting import first_user_message, parse_reply

    common = dict(
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=generations,
        max_steps=steps,
        learning_rate=1e-4,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        temperature=1.0,
        beta=0.0,
        epsilon_high=0.28,
        bf16=False,
    )
    tmp = tempfile.mkdtemp()

    def ours():
        return MultiTurnStarPOTrainer(
            make_model(),
            StarPOConfig(
                output_dir=tmp + "/a",
                env_id="starpo/Bandit-v0",
                num_start_states=batch // generations,
                rollout_filter_ratio=1.0,
                max_turns=1,
                max_tokens_per_turn=32,
                **common,
            ),
            processing_class=tok,
        )

    env = gym.make("starpo/Bandit-v0")
    prompts = []
    for seed in range(64):
        obs, _ = env.reset(seed=seed)
        prompts.append(
            {
                "prompt": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": first_user_message(env, obs, 5, 1, True)},
                ],
                "seed": seed,
            }
        )

    def bandit_reward(completions, seed, **kwargs):
        rewards = []
        for completion, s in zip(completions, seed):
            e = gym.make("starpo/Bandit-v0")
            e.reset(seed=s)
            parsed = parse_reply(completion[0]["content"], max_actions=1)
            rewards.append(e.step(parsed.actions[0])[1] if parsed.format_ok else -0.1)
        return rewards

    def stock():
        return GRPOTrainer(
            make_model(),
            reward_funcs=[bandit_reward],
            processing_class=tok,
            args=GRPOConfig(output_dir=tmp + "/b", max_completion_length=32, **common),
            train_dataset=Dataset.from_list(prompts),
        )

    ChatFormat(tok, [tok.eos_token_id])  # same template check the engine makes, outside the clock
    ratios, runs = [], []
    for rep in range(repeats):
        times = {}
        order = (("starpo", ours), ("trl", stock)) if rep % 2 == 0 else (("trl", stock), ("starpo", ours))
        for name, build in order:
            trainer = build()
            trainer.train()
            steps = [r["step_time"] for r in trainer.state.log_history if "step_time" in r][1:]  # the first warms up
            tokens = [
                r.get("completions/mean_length") for r in trainer.state.log_history if r.get("completions/mean_length")
            ]
            times[name] = (statistics.median(steps), sum(tokens) / len(tokens))
            print(
                f"rep {rep} {name}: median step {times[name][0]:.3f}s, completion tokens {times[name][1]:.1f}",
                flush=True,
            )
        # normalise by model tokens per step, since sampled lengths differ between the two runs
        per_token = {k: t / n for k, (t, n) in times.items()}
        ratios.append(per_token["starpo"] / per_token["trl"])
        runs.append(times)
    middle = runs[sorted(range(repeats), key=lambda i: ratios[i])[repeats // 2]]  # the median repeat's seconds
    return {
        "step_time_ratio_vs_trl_grpo": statistics.median(ratios),
        "step_time_ratio_vs_trl_grpo_repeats": [round(x, 4) for x in ratios],
        "step_seconds": {k: round(v[0], 4) for k, v in middle.items()},
        "mean_completion_tokens": {k: round(v[1], 1) for k, v in middle.items()},
    }


def demo_peak_rss_mib() -> float:
    root = HERE.parent
    subprocess.run(
        [
            sys.executable,
            str(root / "train.py"),
            "--config",
            str(root / "recipes/demo-cpu-frozenlake.yaml"),
            "--output_dir",
            tempfile.mkdtemp(),
            "--report_path",
            tempfile.mktemp(suffix=".json"),
            "--max_steps",
            "4",
            "--warm_start_episodes",
            "64",
            "--num_eval_episodes",
            "256",
            "--disable_tqdm",
            "true",
        ],
        check=True,
        capture_output=True,
    )
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def mi_pass_model() -> tuple[torch.nn.Module, str]:
    """SmolLM2-135M-Instruct when it has been built (``make model``), else the tiny model."""
    loaded = offline_smollm2()
    if loaded is None:
        return build_tiny_model(build_tiny_tokenizer()), "the tiny model"
    return loaded[0], "SmolLM2-135M-Instruct"


def mi_pass_rows(
    model: torch.nn.Module,
    name: str,
    inputs: int = 8,
    reasonings: int = 16,
    input_len: int = 600,
    reasoning_len: int = 12,
    repeats: int = 3,
) -> dict:
    """Seconds of ``cross_logprobs`` with and without the shared prefix on one random sample, at the MI
    pass's batch size of the SmolLM2 FrozenLake recipe (2) and at 16: ``repeats`` pairs, the two ways one
    after the other in each (side by side); the median seconds of each way, and the ratio of each pair
    (``speedup_repeats``) with its median (``speedup``)."""
    from starpo_trl.monitoring.mutual_info import cross_logprobs, mi_forward_passes

    model.eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    xs = [torch.randint(vocab, (input_len,), generator=g).tolist() for _ in range(inputs)]
    zs = [torch.randint(vocab, (reasoning_len,), generator=g).tolist() for _ in range(reasonings)]
    rows = {"model": name, "inputs": inputs, "reasonings": reasonings, "input_len": input_len}
    rows["reasoning_len"] = reasoning_len
    for batch in (2, 16):
        times, scores = {False: [], True: []}, {}
        for _ in range(repeats):
            for shared in (False, True):
                start = time.perf_counter()
                scores[shared] = cross_logprobs(model, xs, zs, 0, batch_size=batch, shared_prefix=shared)
                times[shared].append(time.perf_counter() - start)
            print(f"mi pass batch {batch}: whole {times[False][-1]:.2f}s, shared {times[True][-1]:.2f}s", flush=True)
        ratios = [round(w / h, 2) for w, h in zip(times[False], times[True])]
        rows[f"batch_{batch}"] = {
            "whole_s": round(statistics.median(times[False]), 3),
            "shared_prefix_s": round(statistics.median(times[True]), 3),
            "speedup": round(statistics.median(ratios), 2),
            "speedup_repeats": ratios,
            "max_abs_diff": float((scores[True] - scores[False]).abs().max()),
            "forward_passes_whole": mi_forward_passes(inputs, reasonings, batch, False),
            "forward_passes_shared": mi_forward_passes(inputs, reasonings, batch, True),
        }
    return rows


def main() -> None:
    from report import store

    if sys.argv[1:] == ["mi"]:
        torch.set_num_threads(2)
        store("mi_pass", mi_pass_rows(*mi_pass_model()), seeds=[0])
        return
    engine_only = sys.argv[1:] == ["engine"]

    torch.set_num_threads(2)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok)
    model.eval()
    rows = rollout_rows(model, tok)
    rows.update(real_model_kv_reuse())
    rows.update(step_time_rows(tok, lambda: build_tiny_model(tok, seed=0)))
    rows["demo_peak_rss_mib"] = demo_peak_rss_mib()
    rows["model"] = f"tiny Qwen2 architecture, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters"
    print(json.dumps(rows, indent=2))
    store("speed", rows, seeds=range(REPEATS))
    if not engine_only:
        store("mi_pass", mi_pass_rows(*mi_pass_model()), seeds=[0])


if __name__ == "__main__":
    main()
