"""The empty-step counter: which steps count, when it stops the run and with what message, its
checkpoint state, and the skipped optimizer step (gradients dropped)."""

import pytest
import torch
from helpers import make_args

from starpo_trl.monitoring.empty_steps import EmptySteps


def test_counts_in_a_row_and_stops_naming_the_cause(tmp_path):
    args = make_args(tmp_path, max_empty_steps=2, rollout_filter_empty_stop_steps=3)
    steps = EmptySteps(args, lambda: [])
    assert steps.update(True, False) == {"rollout/empty_step": 1.0, "rollout/empty_after_filter": 0.0}
    assert steps.skip
    steps.update(False, False)  # a step with something to train on breaks the run
    assert not steps.skip and steps.empty_in_a_row == 0
    steps.update(True, True)
    steps.update(True, True)  # filtered out: counted apart from failed episodes
    assert (steps.empty_in_a_row, steps.filtered_out_in_a_row) == (0, 2)
    with pytest.raises(RuntimeError, match="rollout filter kept no group 3 steps in a row"):
        steps.update(True, True)
    steps = EmptySteps(args, lambda: [])
    steps.update(True, False)
    with pytest.raises(RuntimeError, match="2 steps in a row had no model token"):
        steps.update(True, False)


def test_state_round_trip_and_dropped_gradients(tmp_path):
    steps = EmptySteps(make_args(tmp_path, max_empty_steps=5), lambda: [])
    steps.update(True, False)
    restored = EmptySteps(make_args(tmp_path, max_empty_steps=5), lambda: [])
    restored.load_state_dict(steps.state_dict())
    assert restored.state_dict() == {"empty_steps_in_a_row": 1, "filtered_out_in_a_row": 0}
    weight = torch.nn.Parameter(torch.ones(2))
    weight.grad = torch.ones(2)
    restored = EmptySteps(make_args(tmp_path, max_empty_steps=5), lambda: [weight])
    restored.on_pre_optimizer_step(None, None, None)
    assert weight.grad is not None  # not skipped: the gradient stays
    restored.update(True, False)
    restored.on_pre_optimizer_step(None, None, None)
    assert weight.grad is None


@pytest.mark.parametrize("skip", [False, True])
def test_a_step_whose_advantages_are_all_zero_is_skipped_only_when_asked(tmp_path, tiny_tokenizer, scripted, skip):
    """Every episode names Dragon, so each group's rewards agree and every GRPO advantage is 0: the
    only gradient left is the entropy bonus. Without the option AdamW turns it into an update; with it
    no weight moves and each step logs rollout/zero_advantage_step 1."""
    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.tiny import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, seed=3, hidden_size=32, num_layers=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    args = make_args(
        tmp_path, entropy_coef=0.05, weight_decay=0.0, skip_zero_advantage_steps=skip, rollout_filter_ratio=1.0
    )
    backend = scripted("<think>x</think><answer>Dragon</answer>")
    trainer = MultiTurnStarPOTrainer(model, args, processing_class=tiny_tokenizer, backend=backend)
    trainer.train()
    history = trainer.state.log_history
    assert [r["env/Bandit-v0/valid_action_rate"] for r in history if "env/Bandit-v0/valid_action_rate" in r] == [
        1.0,
        1.0,
    ]
    moved = not all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert moved != skip
    logged = [r["rollout/zero_advantage_step"] for r in history if "rollout/zero_advantage_step" in r]
    assert logged == ([1.0, 1.0] if skip else [])


def test_zero_advantage_skip_needs_a_group_estimator(tmp_path):
    with pytest.raises(ValueError, match="skip_zero_advantage_steps needs a group estimator"):
        make_args(tmp_path, skip_zero_advantage_steps=True, advantage_estimator="gae")
