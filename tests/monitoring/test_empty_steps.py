"""The empty-step counter: which steps count, when it stops the run and with what message, its
checkpoint state, and the skipped optimizer step (gradients dropped)."""

import pytest
import torch
from helpers import ZERO_ADVANTAGE_AFTER_UPDATES, make_args, zero_advantage_after_updates_reply
from transformers import TrainerCallback

from starpo_trl.monitoring.empty_steps import EmptySteps, TrainingStopped


def test_counts_in_a_row_and_stops_naming_the_cause(tmp_path):
    args = make_args(tmp_path, max_empty_steps=2, rollout_filter_empty_stop_steps=3)
    steps = EmptySteps.of(args, lambda: [])
    assert steps.update(True, False) == {"rollout/empty_step": 1.0, "rollout/empty_after_filter": 0.0}
    assert steps.skip
    steps.update(False, False)  # a step with something to train on breaks the run
    assert not steps.skip and steps.empty_in_a_row == 0
    steps.update(True, True)
    steps.update(True, True)  # filtered out: counted apart from failed episodes
    assert (steps.empty_in_a_row, steps.filtered_out_in_a_row) == (0, 2)
    with pytest.raises(TrainingStopped, match="rollout filter kept no group 3 steps in a row"):
        steps.update(True, True)
    steps = EmptySteps.of(args, lambda: [])
    steps.update(True, False)
    with pytest.raises(TrainingStopped, match="2 steps in a row had no model token"):
        steps.update(True, False)


def test_state_round_trip_and_dropped_gradients(tmp_path):
    steps = EmptySteps.of(make_args(tmp_path, max_empty_steps=5), lambda: [])
    steps.update(True, False)
    restored = EmptySteps.of(make_args(tmp_path, max_empty_steps=5), lambda: [])
    restored.load_state_dict(steps.state_dict())
    assert restored.state_dict() == {"empty_steps_in_a_row": 1, "filtered_out_in_a_row": 0}
    weight = torch.nn.Parameter(torch.ones(2))
    weight.grad = torch.ones(2)
    restored = EmptySteps.of(make_args(tmp_path, max_empty_steps=5), lambda: [weight])
    restored.on_pre_optimizer_step(None, None, None)
    assert weight.grad is not None  # not skipped: the gradient stays
    restored.update(True, False)
    restored.on_pre_optimizer_step(None, None, None)
    assert weight.grad is None


@pytest.mark.trains
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


def test_a_zero_advantage_step_is_skipped_only_with_the_option_and_counted_apart(tmp_path):
    """update() by hand: a zero-advantage step skips (and zeroes the loss) only with skip_zero_advantage_steps,
    never counts toward the empty-step stop, and an empty step is empty, not zero-advantage."""
    off = EmptySteps.of(make_args(tmp_path), lambda: [])
    assert off.update(False, False, zero_advantage=True) == {
        "rollout/empty_step": 0.0,
        "rollout/empty_after_filter": 0.0,
    }
    assert not off.skip and not off.zero_advantage
    on = EmptySteps.of(make_args(tmp_path, skip_zero_advantage_steps=True, max_empty_steps=2), lambda: [])
    for _ in range(3):  # three in a row: no stop (the stop counts empty steps only)
        metrics = on.update(False, False, zero_advantage=True)
        assert on.skip and on.zero_advantage and metrics["rollout/zero_advantage_step"] == 1.0
        assert on.empty_in_a_row == 0
    assert on.update(False, False)["rollout/zero_advantage_step"] == 0.0 and not on.skip and not on.zero_advantage
    assert on.update(True, False, zero_advantage=True)["rollout/zero_advantage_step"] == 0.0
    assert on.skip and not on.zero_advantage and on.empty_in_a_row == 1


def test_zero_advantage_skip_needs_a_group_estimator(tmp_path):
    with pytest.raises(ValueError, match="skip_zero_advantage_steps needs a group estimator"):
        make_args(tmp_path, skip_zero_advantage_steps=True, advantage_estimator="gae")


class _Snapshots(TrainerCallback):
    """A Trainer callback keeping, after each optimizer step, a copy of every weight and of the whole
    optimizer state (AdamW's step counts and moments)."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        moments = {
            (i, k): (v.clone() if torch.is_tensor(v) else v)
            for i, s in enumerate(optimizer.state_dict()["state"].values())
            for k, v in s.items()
        }
        self.steps.append((weights, moments))


def _identical(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


@pytest.mark.trains
def test_a_skipped_zero_advantage_step_after_real_updates_leaves_weights_and_optimizer_bit_identical(
    tmp_path, tiny_tokenizer, scripted
):
    """Two real updates (half the episodes name Dragon, half write no answer: advantages are not 0), with
    weight decay on, so AdamW's moments are non-zero; then a step where every episode names Dragon (every
    advantage 0). A zeroed loss alone would still move the weights through the moments and the decay: the
    skipped step must leave every weight and every optimizer state tensor bit-identical."""
    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.tiny import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, seed=3, hidden_size=32, num_layers=1)
    args = make_args(tmp_path, **ZERO_ADVANTAGE_AFTER_UPDATES)
    snapshots = _Snapshots()
    backend = scripted(zero_advantage_after_updates_reply)
    trainer = MultiTurnStarPOTrainer(
        model, args, processing_class=tiny_tokenizer, backend=backend, callbacks=[snapshots]
    )
    trainer.train()
    logged = [
        r["rollout/zero_advantage_step"] for r in trainer.state.log_history if "rollout/zero_advantage_step" in r
    ]
    assert logged == [0.0, 0.0, 1.0]
    (w1, m1), (w2, m2), (w3, m3) = snapshots.steps
    assert not _identical(w1, w2) and not _identical(m1, m2)  # the second step did update
    assert any(v.abs().sum() > 0 for (_, k), v in m2.items() if k == "exp_avg")  # non-zero moments
    assert _identical(w2, w3) and _identical(m2, m3)


@pytest.mark.trains
def test_a_skipped_zero_advantage_step_is_bit_identical_on_two_processes(tmp_path):
    """The same three steps under torchrun in 2 CPU processes (DDP, gloo; tests/distributed/dist_zero_advantage_skip.py):
    on both processes the skipped third step leaves the weights' and the optimizer state's digests as they were
    after the second, which moved both."""
    from helpers import run_two_processes

    ranks = run_two_processes("dist_zero_advantage_skip.py", tmp_path, 29583)
    for rank in ranks:
        assert rank["num_processes"] == 2 and rank["zero_advantage"] == [0.0, 0.0, 1.0]
        first, second, third = rank["steps"]
        assert first["weights"] != second["weights"] and first["optimizer"] != second["optimizer"]
        assert second == third
    assert ranks[0]["steps"] == ranks[1]["steps"]


def test_a_new_counter_skips_nothing_and_an_old_checkpoint_without_counts_restores_zeros(tmp_path):
    steps = EmptySteps.of(make_args(tmp_path), lambda: [])
    assert steps.skip is False and steps.zero_advantage is False
    assert steps.state_dict() == {"empty_steps_in_a_row": 0, "filtered_out_in_a_row": 0}
    assert type(steps.empty_in_a_row) is int and type(steps.filtered_out_in_a_row) is int
    steps.load_state_dict({"empty_steps_in_a_row": 2, "filtered_out_in_a_row": 3})
    assert (steps.empty_in_a_row, steps.filtered_out_in_a_row) == (2, 3)
    steps.load_state_dict({})  # a checkpoint written before these counts existed
    assert steps.state_dict() == {"empty_steps_in_a_row": 0, "filtered_out_in_a_row": 0}


def test_the_filter_stop_message_says_what_to_change(tmp_path):
    steps = EmptySteps.of(make_args(tmp_path, rollout_filter_empty_stop_steps=1), lambda: [])
    with pytest.raises(RuntimeError) as err:
        steps.update(True, True)
    assert str(err.value) == (
        "The rollout filter kept no group 1 steps in a row (rollout_filter_strategy='top_k', metric='std', "
        "include_zero=True): every group's score was zero or below the threshold, so the policy gets no signal "
        "(collapsed, or the task is too hard or too easy). Set rollout_filter_include_zero=True, lower "
        "rollout_filter_eps, use top_k, or raise rollout_filter_empty_stop_steps."
    )


def test_the_empty_step_stop_names_every_training_env_and_reads_its_own_settings(tmp_path):
    """The counter takes the scoring settings and its own limit (not the whole config); its message names the
    training envs, each once, also when a run trains several (env_id then holds only the first)."""
    from starpo_trl.algorithms.settings import ScoringSettings

    envs = [
        {"env_id": "starpo/Bandit-v0", "n_groups": 1},
        {"env_id": "starpo/FrozenLake-v0", "n_groups": 1},
        {"env_id": "starpo/Bandit-v0", "n_groups": 2, "name": "Bandit-again"},
    ]
    args = make_args(tmp_path, env_id=None, env_configs=envs, num_start_states=4, max_empty_steps=1)
    steps = EmptySteps.of(args, lambda: [])
    assert steps.settings == ScoringSettings.of(args) and steps.max_empty_steps == 1
    with pytest.raises(RuntimeError, match=r"Fix the env \(starpo/Bandit-v0, starpo/FrozenLake-v0\)"):
        steps.update(True, False)


def test_the_empty_step_stop_names_masked_cut_replies_when_they_are_the_cause(tmp_path):
    """A step left empty because ``overlong_turns: mask`` took every reply (cut at the token limit) stops with
    a message that names that setting and the limit, not a failing env."""
    steps = EmptySteps.of(make_args(tmp_path, max_empty_steps=2, overlong_turns="mask"), lambda: [])
    steps.update(True, False, cut_masked=True)
    with pytest.raises(RuntimeError, match=r"overlong_turns='mask' left them out of the loss") as stop:
        steps.update(True, False, cut_masked=True)
    assert "Raise max_tokens_per_turn" in str(stop.value) and "Fix the env" not in str(stop.value)


@pytest.mark.trains
def test_a_run_whose_every_reply_is_cut_and_masked_stops_naming_the_mask(tmp_path, tiny_tokenizer, scripted):
    """Every reply runs past its 12-token limit; with overlong_turns: mask no model token is left to train on,
    and after max_empty_steps such steps the run stops naming overlong_turns (it named a failing env before)."""
    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.tiny import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, seed=3, hidden_size=32, num_layers=1)
    args = make_args(tmp_path, overlong_turns="mask", max_empty_steps=2, rollout_filter_ratio=1.0)
    backend = scripted("<think>" + "a b c d e f g h " * 4 + "</think><answer>Dragon</answer>")
    trainer = MultiTurnStarPOTrainer(model, args, processing_class=tiny_tokenizer, backend=backend)
    with pytest.raises(RuntimeError, match=r"2 steps in a row had no model token .*overlong_turns='mask'"):
        trainer.train()
