"""Each layer owns its settings (#46): one definition per field, checks that run on the layer's own class, the
config composed from the classes, and the lists that used to be copied (evaluate.py's flags, the saved rollout
settings, the model card's episode table) read from the class."""

import dataclasses

import pytest

from starpo_trl.algorithms.settings import AdvantageSettings, CriticSettings, FilterSettings, ScoringSettings
from starpo_trl.config import NUMBER_RANGES, ROLLOUT_SETTINGS, StarPOConfig
from starpo_trl.monitoring.settings import GuardSettings, MISettings
from starpo_trl.rollout import RolloutConfig
from starpo_trl.rollout.settings import RolloutSettings
from starpo_trl.settings_base import Settings

LAYERS = (RolloutSettings, FilterSettings, AdvantageSettings, CriticSettings, GuardSettings, MISettings)


def names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_config_is_composed_from_the_layers_and_declares_no_layer_field_again():
    own = set(StarPOConfig.__dict__["__annotations__"])
    for cls in LAYERS:
        assert issubclass(StarPOConfig, cls)
        assert not own & names(cls), f"StarPOConfig declares {sorted(own & names(cls))} of {cls.__name__} again"
    seen = {}
    for cls in LAYERS:  # no field belongs to two layers
        for name in names(cls):
            assert name not in seen, f"{name} is declared by {seen[name]} and {cls.__name__}"
            seen[name] = cls.__name__
    # the config's defaults are the layers' own
    config = StarPOConfig(output_dir="/tmp/unused", report_to=[], use_cpu=True, bf16=False)
    for cls in LAYERS:
        assert cls.of(config) == cls(), cls.__name__


def test_of_reads_only_the_class_own_fields():
    config = StarPOConfig(
        output_dir="/tmp/unused", report_to=[], use_cpu=True, bf16=False, max_turns=3, rollout_filter_ratio=0.5
    )
    rollout, scoring = RolloutSettings.of(config), ScoringSettings.of(config)
    assert type(rollout) is RolloutSettings and rollout.max_turns == 3 and not hasattr(rollout, "rollout_filter_ratio")
    assert scoring.rollout_filter_ratio == 0.5 and scoring.advantage_estimator == "grpo"
    assert not hasattr(scoring, "max_turns") and not hasattr(scoring, "learning_rate")
    assert set(rollout.values()) == names(RolloutSettings)
    engine = RolloutConfig.of(config)  # the engine's: the rollout settings plus training's sampling temperature
    assert engine.max_turns == 3 and engine.temperature == config.temperature
    assert all(issubclass(cls, Settings) for cls in LAYERS)


@pytest.mark.parametrize(
    "cls, check, bad, message",
    [
        (RolloutSettings, "check_rollout", {"max_turns": 0}, "max_turns must be at least 1"),
        (RolloutSettings, "check_rollout", {"context_window": "last:2"}, "context_window must be"),
        (RolloutSettings, "check_rollout", {"overlong_buffer": 300}, "overlong_buffer=300"),
        (RolloutSettings, "check_rollout", {"env_runner": "inline", "env_step_timeout": 1.0}, "needs env_runner"),
        (FilterSettings, "check_filter", {"rollout_filter_strategy": "top_q"}, "rollout_filter_strategy must be"),
        (FilterSettings, "check_filter", {"rollout_filter_refill": True}, "never refills"),
        (AdvantageSettings, "check_advantages", {"advantage_estimator": "ppo2"}, "ppo2"),
        (AdvantageSettings, "check_advantages", {"turn_gamma": 1.5}, "turn_gamma is a discount"),
        (CriticSettings, "check_critic", {"value_loss_tokens": "some"}, "value_loss_tokens"),
        (GuardSettings, "check_guard", {"collapse_guard": "panic"}, "collapse_guard must be"),
        (MISettings, "check_mi", {"mi_metrics_turn": "last"}, "mi_metrics_turn"),
    ],
)
def test_each_layer_checks_its_own_fields_and_the_config_runs_the_same_check(cls, check, bad, message):
    getattr(cls(), check)()  # the defaults pass
    with pytest.raises(ValueError, match=message):
        getattr(cls(**bad), check)()
    with pytest.raises(ValueError, match=message):  # and the config refuses the same value before any model loads
        StarPOConfig(output_dir="/tmp/unused", report_to=[], use_cpu=True, bf16=False, **bad)


def test_every_numeric_field_of_every_layer_has_its_range_in_the_config():
    for cls in LAYERS:
        for f in dataclasses.fields(cls):
            if f.type in ("int", "float", "int | None", "float | None"):
                assert f.name in NUMBER_RANGES, f"{cls.__name__}.{f.name}"


def test_the_saved_rollout_settings_and_evaluate_flags_are_the_rollout_class():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import evaluate

    assert set(ROLLOUT_SETTINGS) == names(RolloutSettings) | {
        "env_id",
        "env_kwargs",
        "eval_env_id",
        "eval_env_kwargs",
        "eval_env_configs",
        "eval_seed_offset",
        "num_eval_episodes",
    }
    flags = {a.dest for a in evaluate.parser()._actions}
    assert names(RolloutSettings) - {"eval_temperature"} <= flags  # eval_temperature is --temperature
    parsed = evaluate.parser().parse_args(
        ["--model_name_or_path", "m", "--overlong_turns", "mask", "--enable_think", "false", "--stop_strings", "</a>"]
    )
    assert parsed.overlong_turns == "mask" and parsed.enable_think is False and parsed.stop_strings == ["</a>"]


def test_the_model_card_lists_every_episode_setting(tmp_path):
    from starpo_trl.monitoring.model_card import render_model_card

    config = StarPOConfig(
        output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, env_id="starpo/Bandit-v0", max_turns=1
    )
    card = str(render_model_card(config, None, {}, None, None))
    for name in names(RolloutSettings):
        assert f"| `{name}` |" in card, name
    assert "| `max_turns` | `1` |" in card
