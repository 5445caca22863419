"""Run by tests/monitoring/test_empty_steps.py under torchrun (2 processes, gloo): the zero-advantage skip
after real updates. Two steps where half the episodes name Dragon and half write no answer (advantages not
0), with weight decay, then one where every episode names Dragon (every advantage 0, the step skipped).
Writes ``rank-N.json`` into argv[1]: a digest of the weights and of the whole optimizer state after each step,
and the logged ``rollout/zero_advantage_step``."""

import hashlib
import json
import pathlib
import sys

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: the suite's helpers
from conftest import ScriptedBackend  # noqa: E402  (registers the starpo/* envs too)
from helpers import ZERO_ADVANTAGE_AFTER_UPDATES, make_args, zero_advantage_after_updates_reply  # noqa: E402

import train  # noqa: E402
from starpo_trl import MultiTurnStarPOTrainer  # noqa: E402
from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer  # noqa: E402


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


class Digests(TrainerCallback):
    def __init__(self):
        super().__init__()
        self.steps = []

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        opt = optimizer.state_dict()["state"]
        moments = [v if torch.is_tensor(v) else torch.tensor(float(v)) for s in opt.values() for v in s.values()]
        self.steps.append({"weights": digest(model.parameters()), "optimizer": digest(moments)})


def main(out):
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=3, hidden_size=32, num_layers=1)
    args = make_args(
        out, per_device_train_batch_size=2, num_eval_episodes=4, use_cpu=True, **ZERO_ADVANTAGE_AFTER_UPDATES
    )
    digests = Digests()
    trainer = MultiTurnStarPOTrainer(
        model,
        args,
        processing_class=tokenizer,
        backend=ScriptedBackend(tokenizer, zero_advantage_after_updates_reply, tokenizer.eos_token_id),
        callbacks=[digests],
    )
    trainer.train()
    logged = [
        r["rollout/zero_advantage_step"] for r in trainer.state.log_history if "rollout/zero_advantage_step" in r
    ]
    rank = trainer.accelerator.process_index
    summary = {"num_processes": trainer.accelerator.num_processes, "steps": digests.steps, "zero_advantage": logged}
    (pathlib.Path(out) / f"rank-{rank}.json").write_text(json.dumps(summary))
    train.end_process_group()  # every rank done, then the group ended (gloo can abort at exit otherwise)


if __name__ == "__main__":
    main(sys.argv[1])
