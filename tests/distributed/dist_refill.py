"""Run by tests/test_refill.py under torchrun (2 processes, gloo): two training steps with the refill on, the
first of whose first round has no group with spread. Writes ``rank-N.json`` into argv[1]: the seeds this
process played per round, the kept groups per step and the logged rounds."""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: the suite's helpers
from conftest import ScriptedBackend  # noqa: E402  (registers the starpo/* envs too)
from helpers import make_args  # noqa: E402
from test_refill import REFILL, constant_then_mixed  # noqa: E402

import train  # noqa: E402
from starpo_trl import MultiTurnStarPOTrainer  # noqa: E402
from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer  # noqa: E402


def main(out):
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=3, hidden_size=32, num_layers=1)
    args = make_args(
        out,
        **REFILL,
        per_device_train_batch_size=2,
        env_kwargs={"expected_reward": True},
        num_train_seeds=1000,
        use_cpu=True,
    )
    backend = ScriptedBackend(tokenizer, constant_then_mixed, tokenizer.eos_token_id)
    trainer = MultiTurnStarPOTrainer(model, args, processing_class=tokenizer, backend=backend)
    played, play = [], trainer.play
    trainer.play = lambda starts, temperature: played.append([s.seed for s in starts]) or play(starts, temperature)
    trainer.train()
    rounds = [r["rollout/refill_rounds"] for r in trainer.state.log_history if "rollout/refill_rounds" in r]
    summary = {
        "num_processes": trainer.accelerator.num_processes,
        "played": played,
        "kept": [step["kept"] for step in trainer.kept_group_history],
        "group_std": [step["group_std"] for step in trainer.kept_group_history],
        "rounds": rounds,
    }
    (pathlib.Path(out) / f"rank-{trainer.accelerator.process_index}.json").write_text(json.dumps(summary))
    train.end_process_group()  # every rank done, then the group ended (gloo can abort at exit otherwise)


if __name__ == "__main__":
    main(sys.argv[1])
