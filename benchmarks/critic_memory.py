"""Peak memory of LoRA-critic vs full-critic training on the same model, measured side by side.

    python benchmarks/critic_memory.py

Runs a few training steps of a LoRA policy three times, each in a fresh process (no critic,
``critic_type=lora``, ``critic_type=full``), reads each process's peak resident memory, and stores
the rows in benchmarks/results.json and BENCHMARKS.md. The model is the offline tiny architecture
scaled up (no download), so the absolute numbers are small; the ratio is the point.
"""

from __future__ import annotations

import json
import pathlib
import resource
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

HIDDEN, LAYERS, STEPS, ENV = 768, 8, 2, "starpo/Bandit-v0"


def worker(mode: str) -> None:
    import tempfile
    import warnings

    warnings.filterwarnings("ignore")
    from peft import LoraConfig

    from starpo_trl import MultiTurnStarPOTrainer, StarPOConfig
    from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=HIDDEN, num_layers=LAYERS)
    extra = {} if mode == "none" else {"advantage_estimator": "gae", "critic_type": mode}
    args = StarPOConfig(
        output_dir=tempfile.mkdtemp(),
        env_id=ENV,
        num_start_states=4,
        num_generations=4,
        rollout_filter_ratio=1.0,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        max_steps=STEPS,
        max_turns=1,
        max_tokens_per_turn=16,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        **extra,
    )
    peft = LoraConfig(
        r=64,
        lora_alpha=64,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    MultiTurnStarPOTrainer(model, args, processing_class=tok, peft_config=peft).train()
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "params": params}))


def main() -> None:
    from report import store

    rows, params = {}, 0
    for mode, label in (("none", "grpo, no critic"), ("lora", "gae, LoRA critic"), ("full", "gae, full critic")):
        out = subprocess.run([sys.executable, __file__, "--worker", mode], capture_output=True, text=True, check=True)
        data = json.loads(out.stdout.strip().splitlines()[-1])
        rows[label] = data["peak_rss_kib"] / 1024
        params = data["params"]
        print(f"{label:20s} peak RSS {rows[label]:8.0f} MiB")
    base, lora, full = rows["grpo, no critic"], rows["gae, LoRA critic"], rows["gae, full critic"]
    store(
        "critic_memory",
        {
            "model": f"Qwen2 architecture, hidden {HIDDEN}, {LAYERS} layers, {params / 1e6:.1f}M parameters, LoRA r=64 on all linear layers",
            "env_id": ENV,
            "steps": STEPS,
            "peak_rss_mib": rows,
            "lora_vs_full_ratio": lora / full,
            "lora_extra_mib": lora - base,
            "full_extra_mib": full - base,
        },
        seeds=None,
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
