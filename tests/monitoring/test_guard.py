"""CollapseGuard: rules on synthetic streams (fire at the right log, not before), the rollback path."""

import json
import os

import pytest
import torch
from helpers import make_args
from safetensors.torch import load_file

from starpo_trl import MultiTurnStarPOTrainer
from starpo_trl.monitoring.guard import CollapseGuard, CollapseMonitor, signals_from_logs
from starpo_trl.monitoring.settings import GuardSettings


def first_firing(rules, stream, signal):
    monitor = CollapseMonitor(rules)
    for step, value in enumerate(stream, start=1):
        if signal in monitor.update(step, {signal: value}):
            return step
    return None


def test_reward_std_rule_fires_after_patience_not_before():
    rules = GuardSettings(
        collapse_guard_warmup_steps=3,
        collapse_guard_smoothing=1.0,
        collapse_guard_reward_std_fraction=0.25,
        collapse_guard_patience=2,
    )
    # early level 1.0; threshold 0.25; 0.2 at steps 5 and 6 -> fires at 6 (patience 2)
    assert first_firing(rules, [1, 1, 1, 0.5, 0.2, 0.2, 0.1], "reward_std") == 6
    # one dip that recovers never fires
    assert first_firing(rules, [1, 1, 1, 0.2, 0.9, 0.2, 0.9, 0.2], "reward_std") is None


def test_smoothing_delays_the_warning_by_hand_worked_emas():
    rules = GuardSettings(
        collapse_guard_warmup_steps=3,
        collapse_guard_smoothing=0.5,
        collapse_guard_reward_std_fraction=0.25,
        collapse_guard_patience=2,
    )
    # EMA: 1, 1, 1, then 0.75 (0.5), 0.475 (0.2), 0.3375 (0.2), 0.21875 (0.1), 0.159375 (0.1)
    # below 0.25 first at step 7, second time at step 8 -> fires at 8
    assert first_firing(rules, [1, 1, 1, 0.5, 0.2, 0.2, 0.1, 0.1], "reward_std") == 8


def test_entropy_rule_and_noise_that_stays_healthy():
    rules = GuardSettings(
        collapse_guard_warmup_steps=4,
        collapse_guard_smoothing=1.0,
        collapse_guard_entropy_fraction=0.5,
        collapse_guard_patience=1,
    )
    assert (
        first_firing(rules, [2.0, 2.2, 1.8, 2.0, 1.5, 1.2, 1.1, 0.9], "entropy") == 8
    )  # early 2.0, below 1.0 at step 8
    assert first_firing(rules, [2.0, 2.2, 1.8, 2.0, 1.5, 2.5, 1.1, 1.9], "entropy") is None


def test_grad_norm_spike_against_running_mean():
    rules = GuardSettings(
        collapse_guard_warmup_steps=3,
        collapse_guard_smoothing=0.5,
        collapse_guard_grad_norm_spike=10.0,
        collapse_guard_patience=1,
    )
    # running mean stays 1.0; 9.0 is not a spike (< 10 x 1.0), 12.0 is
    assert first_firing(rules, [1, 1, 1, 1, 9.0, 1.0], "grad_norm") is None
    monitor = CollapseMonitor(
        GuardSettings(
            collapse_guard_warmup_steps=3,
            collapse_guard_smoothing=0.5,
            collapse_guard_grad_norm_spike=10.0,
            collapse_guard_patience=2,
        )
    )
    fired = [monitor.update(s, {"grad_norm": v}) for s, v in enumerate([1, 1, 1, 1, 12.0, 12.0], start=1)]
    # the first spike does not raise the mean it is judged against, so the second one counts too
    assert fired == [[], [], [], [], [], ["grad_norm"]]


def test_diversity_floor_and_each_rule_warns_once():
    # early level 0.75; fraction 0.5 -> threshold 0.375
    rules = GuardSettings(
        collapse_guard_warmup_steps=2,
        collapse_guard_smoothing=1.0,
        collapse_guard_diversity_fraction=0.5,
        collapse_guard_patience=1,
    )
    monitor = CollapseMonitor(rules)
    fired = [monitor.update(s, {"diversity": v}) for s, v in enumerate([0.8, 0.7, 0.4, 0.3, 0.04, 0.6, 0.01], start=1)]
    assert fired == [[], [], [], ["diversity"], [], [], []]
    # an absolute floor above the relative threshold wins
    floor = GuardSettings(
        collapse_guard_warmup_steps=2,
        collapse_guard_smoothing=1.0,
        collapse_guard_diversity_fraction=0.5,
        collapse_guard_diversity_floor=0.45,
        collapse_guard_patience=1,
    )
    assert first_firing(floor, [0.8, 0.7, 0.4], "diversity") == 3


def test_thresholds_by_hand():
    """Each falling signal's threshold is its fraction of the early level (the mean of its first
    values): reward std 0.4 x 0.5, entropy 0.4 x 0.25, retrieval 0.5 x 0.3 (3 passes), diversity the larger of
    0.5 x 0.6 and its floor 0.35; none before the early level is known, for grad norm, or for an early level <= 0."""
    monitor = CollapseMonitor(
        GuardSettings(
            collapse_guard_warmup_steps=2, collapse_guard_retrieval_warmup=3, collapse_guard_diversity_floor=0.35
        )
    )
    for step, (std, ent, div, ret) in enumerate([(0.4, 0.2, 0.5, 0.2), (0.6, 0.3, 0.7, 0.4)], start=1):
        monitor.update(step, {"reward_std": std, "entropy": ent, "diversity": div, "retrieval": ret, "grad_norm": 1.0})
    assert monitor.threshold("reward_std") == pytest.approx(0.2)
    assert monitor.threshold("entropy") == pytest.approx(0.1)
    assert monitor.threshold("diversity") == pytest.approx(0.35)
    assert monitor.threshold("retrieval") is None  # 2 of its 3 passes
    monitor.update(3, {"retrieval": 0.3})
    assert monitor.threshold("retrieval") == pytest.approx(0.15)
    assert monitor.threshold("grad_norm") is None
    flat = CollapseMonitor(GuardSettings(collapse_guard_warmup_steps=2))
    for step in (1, 2):
        flat.update(step, {"entropy": 0.0})
    assert flat.early_level("entropy") == 0.0 and flat.threshold("entropy") is None


def test_missing_and_nan_signals_are_skipped():
    monitor = CollapseMonitor(
        GuardSettings(collapse_guard_warmup_steps=2, collapse_guard_smoothing=1.0, collapse_guard_patience=1)
    )
    assert monitor.update(1, {"entropy": float("nan")}) == []
    assert monitor.update(2, {}) == []
    assert monitor.series["entropy"].early == []


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _logs(std):
    return {"loss": 0.0, "grad_norm": 1.0, "entropy": 1.0, "env/Bandit-v0/group_reward_std_mean": std}


@pytest.mark.parametrize("action", ["rollback", "stop"])
def test_rollback_restores_the_last_healthy_weights_exactly(tmp_path, tiny_tokenizer, fresh_model, action):
    args = make_args(
        tmp_path,
        collapse_guard=action,
        collapse_guard_warmup_steps=2,
        collapse_guard_patience=1,
        collapse_guard_smoothing=1.0,
        collapse_guard_snapshot_steps=2,
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    guard, state, control = trainer.guard, trainer.state, trainer.control
    guard.on_train_begin(args, state, control, model=trainer.model)  # as Trainer's callback handler calls it

    def nudge(scale):
        with torch.no_grad():
            for p in trainer.model.parameters():
                if p.requires_grad:
                    p.add_(scale * torch.randn_like(p))

    seen = {}
    for step, std in enumerate([1.0, 1.0, 0.9, 0.8, 0.01], start=1):
        nudge(0.01)
        state.global_step = step
        seen[step] = _params(trainer.model)
        guard.on_log(args, state, control, logs=_logs(std), model=trainer.model)
    # snapshots at healthy steps 2 and 4; the warning at step 5 (0.01 < 0.25 x 1.0)
    assert guard.snapshot_step == 4 and control.should_training_stop
    expected = seen[4] if action == "rollback" else seen[5]
    for name, value in _params(trainer.model).items():
        assert torch.equal(value, expected[name]), name
    saved = load_file(os.path.join(tmp_path, "last-healthy", "model.safetensors"))
    for name, value in seen[4].items():
        assert torch.equal(saved[name], value), name
    events = json.load(open(os.path.join(tmp_path, "guard_events.json")))
    assert events[0]["step"] == 5 and events[0]["rules"] == ["reward_std"] and events[0]["last_healthy_step"] == 4


def test_guard_warns_inside_a_real_training_run(tmp_path, tiny_tokenizer, fresh_model):
    # spike factor 0: any grad norm after the first log counts as a spike, so it must fire at step 2
    args = make_args(
        tmp_path,
        max_steps=3,
        collapse_guard="warn",
        collapse_guard_warmup_steps=1,
        collapse_guard_patience=1,
        collapse_guard_grad_norm_spike=0.0,
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    trainer.train()
    assert trainer.state.global_step == 3  # warn never stops
    flagged = [row["step"] for row in trainer.state.log_history if row.get("guard/warning")]
    assert flagged == [2]
    assert json.load(open(os.path.join(tmp_path, "guard_events.json")))[0]["rules"] == ["grad_norm"]


def test_guard_config_errors(tmp_path):
    with pytest.raises(ValueError, match="collapse_guard"):
        make_args(tmp_path, collapse_guard="panic")
    with pytest.raises(ValueError, match="collapse_guard_smoothing"):
        make_args(tmp_path, collapse_guard_smoothing=0.0)


def test_each_env_has_its_own_reward_std_series():
    """A run with several envs watches each env's in-group reward std on its own: one env collapsing fires
    its rule (by hand: early level 1.0, threshold 0.25) while the other, whose std never falls, stays quiet,
    and their early levels are not mixed (the mean of both would be 0.55 and never fall below 0.1375)."""
    rules = GuardSettings(
        collapse_guard_warmup_steps=2,
        collapse_guard_smoothing=1.0,
        collapse_guard_reward_std_fraction=0.25,
        collapse_guard_patience=1,
    )
    monitor = CollapseMonitor(rules)
    lake = [1.0, 1.0, 0.5, 0.2, 0.2]
    bandit = [0.1, 0.1, 0.1, 0.1, 0.1]
    fired = [
        monitor.update(step, {"reward_std/Bandit-v0": b, "reward_std/FrozenLake-v0": f})
        for step, (b, f) in enumerate(zip(bandit, lake), start=1)
    ]
    assert fired == [[], [], [], ["reward_std/FrozenLake-v0"], []]
    assert monitor.early_level("reward_std/Bandit-v0") == pytest.approx(0.1)
    assert monitor.threshold("reward_std/FrozenLake-v0") == pytest.approx(0.25)
    with pytest.raises(ValueError, match="unknown guard signal"):
        monitor.update(6, {"reward/Bandit-v0": 0.1})


def test_signals_from_logs_names_one_env_plainly_and_several_by_env():
    row = {
        "loss": 0.0,
        "entropy": 1.5,
        "env/Bandit-v0/group_reward_std_mean": 0.3,
        "env/lake-4x4/group_reward_std_mean": 0.7,
    }
    assert signals_from_logs(row, "Bandit-v0") == {"reward_std": 0.3, "entropy": 1.5}
    assert signals_from_logs(row, ["lake-4x4"]) == {"reward_std": 0.7, "entropy": 1.5}
    assert signals_from_logs(row, ["Bandit-v0", "lake-4x4"]) == {
        "reward_std/Bandit-v0": 0.3,
        "reward_std/lake-4x4": 0.7,
        "entropy": 1.5,
    }
    with pytest.raises(ValueError, match="at least one"):
        signals_from_logs(row, [])
    with pytest.raises(ValueError, match="as a list"):
        CollapseGuard(GuardSettings(collapse_guard="warn"), "Bandit-v0")


def test_a_multi_env_trainer_guard_watches_every_training_env_by_its_metric_name(
    tmp_path, tiny_tokenizer, fresh_model
):
    """Under env_configs the guard watches each training env under the name its metrics are logged with (a
    config's own ``name`` too), not only the first env (``env_id``), and warns for the env that collapses."""
    args = make_args(
        tmp_path,
        env_id=None,
        env_configs=[{"env_id": "starpo/Bandit-v0"}, {"env_id": "starpo/FrozenLake-v0", "name": "lake"}],
        collapse_guard="warn",
        collapse_guard_warmup_steps=2,
        collapse_guard_patience=1,
        collapse_guard_smoothing=1.0,
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    guard, state, control = trainer.guard, trainer.state, trainer.control
    assert guard.envs == ["Bandit-v0", "lake"]
    for step, lake_std in enumerate([1.0, 1.0, 0.9, 0.1], start=1):
        state.global_step = step
        logs = {"loss": 0.0, "env/Bandit-v0/group_reward_std_mean": 0.5, "env/lake/group_reward_std_mean": lake_std}
        guard.on_log(args, state, control, logs=logs, model=trainer.model)
    assert [event["rules"] for event in guard.events] == [["reward_std/lake"]]
    assert guard.events[0]["step"] == 4 and not control.should_training_stop
