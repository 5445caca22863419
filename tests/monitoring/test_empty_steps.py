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
