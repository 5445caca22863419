"""What the trainer writes beside Trainer's own files, and reads back on resume.

- In each checkpoint: the critic (``value_model/``: weights and optimizer state) and the run state
  between steps (``starpo_state.json``: the last rollout's reasoning, the empty-step counts).
- With a saved model: the critic, and the rollout settings (``starpo_rollout.json``) that
  ``evaluate.py`` reads back to play the model's episodes as training's evaluation did.

Saving the critic is collective where it is sharded: every process calls these functions, and only
those with ``write=True`` write.
"""

from __future__ import annotations

import json
import os

from starpo_trl.config import ROLLOUT_SETTINGS_FILE

RUN_STATE_FILE = "starpo_state.json"
CRITIC_FOLDER = "value_model"


def save_checkpoint_extras(folder: str, critic, run_state: dict, write: bool) -> None:
    """The critic (if any) and ``run_state`` into the checkpoint ``folder``."""
    if critic is not None:
        critic.save(os.path.join(folder, CRITIC_FOLDER), write=write)
    if write:
        with open(os.path.join(folder, RUN_STATE_FILE), "w") as f:
            json.dump(run_state, f)


def load_critic(folder: str, critic) -> None:
    """Restore the critic (weights and optimizer) saved in ``folder/value_model``, if both exist."""
    path = os.path.join(folder, CRITIC_FOLDER)
    if critic is not None and os.path.isdir(path):
        critic.load(path)


def load_checkpoint_extras(folder: str, critic) -> dict:
    """Restore the critic from the checkpoint ``folder``; returns its run state (empty if it has none)."""
    load_critic(folder, critic)
    path = os.path.join(folder, RUN_STATE_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def save_model_extras(folder: str, args, critic, write: bool) -> None:
    """The rollout settings of ``args`` (a ``StarPOConfig``) and the critic (if given) beside a saved model."""
    if write:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, ROLLOUT_SETTINGS_FILE), "w") as f:
            json.dump(args.rollout_settings(), f, indent=2)
    if critic is not None:
        critic.save(os.path.join(folder, CRITIC_FOLDER), write=write)
