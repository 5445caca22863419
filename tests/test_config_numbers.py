"""One rule for every numeric setting (starpo_trl/numeric_settings.py): a whole number where the type is int, a
finite number, None only where allowed, inside the declared range; refused before any model loads (#45, item 4)."""

import math
from dataclasses import dataclass, field

import pytest
from helpers import make_args

from starpo_trl.config import NUMBER_RANGES, RUN_NUMBER_RANGES, RunArguments, StarPOConfig
from starpo_trl.numeric_settings import Range, check_declared, check_number, numeric_fields

NUMERIC = numeric_fields(StarPOConfig, own_only=True)


def refused(tmp_path, name, value) -> str:
    with pytest.raises(ValueError) as err:
        make_args(tmp_path, **{name: value})
    return str(err.value)


def test_every_numeric_field_refuses_nan_inf_and_the_wrong_kind(tmp_path):
    assert len(NUMERIC) >= 50 and set(NUMERIC) == set(NUMBER_RANGES)
    for name, (kind, nullable) in NUMERIC.items():
        for bad in (math.nan, math.inf, -math.inf, "1", True):
            assert refused(tmp_path, name, bad).startswith(f"{name}="), (name, bad)
        if kind is int:
            assert "is not a whole number" in refused(tmp_path, name, 1.5), name
            assert "is not a whole number" in refused(tmp_path, name, 2.0), name
        if not nullable:
            assert refused(tmp_path, name, None).startswith(f"{name}=None"), name


def test_every_numeric_field_refuses_a_value_outside_its_range(tmp_path):
    for name, allowed in NUMBER_RANGES.items():
        kind = NUMERIC[name][0]
        step = 1 if kind is int else 0.5
        outside = []
        if allowed.low is not None:
            outside.append(allowed.low if allowed.low_open else allowed.low - step)
        if allowed.high is not None:
            outside.append(allowed.high if allowed.high_open else allowed.high + step)
        for value in outside:
            assert name in refused(tmp_path, name, value), (name, value)


def test_the_cases_that_used_to_pass(tmp_path):
    """Each was accepted before: max_turns=nan failed later inside train(); rollout_filter_eps=nan kept one group
    per step and inf kept none; think_bonus=nan logged reward None; the guard fractions took NaN or -1."""
    cases = [
        ("max_turns", math.nan),
        ("rollout_filter_eps", math.nan),
        ("rollout_filter_eps", math.inf),
        ("think_bonus", math.nan),
        ("mi_metrics_every", 1.5),
        ("env_failure_reward", math.nan),
        ("collapse_guard_reward_std_fraction", math.nan),
        ("collapse_guard_entropy_fraction", -1.0),
        ("collapse_guard_diversity_fraction", math.nan),
        ("collapse_guard_retrieval_fraction", -1.0),
    ]
    for name, value in cases:
        assert refused(tmp_path, name, value).startswith(f"{name}="), name
    message = refused(tmp_path, "mi_metrics_every", 1.5)
    assert message == (
        "mi_metrics_every=1.5 is not a whole number: give a whole number in [0, inf) "
        "(Mutual-information collapse metrics every this many steps (0: off))."
    )


def test_values_inside_the_ranges_are_accepted(tmp_path):
    args = make_args(
        tmp_path,
        env_failure_reward=-5.0,
        collapse_guard_entropy_fraction=0.0,
        collapse_guard_smoothing=1.0,
        turn_lambda=None,
        value_clip=None,
        env_step_timeout=None,
        gamma=0.0,
        mi_metrics_every=0,
        format_penalty=0.0,
    )
    assert (args.env_failure_reward, args.collapse_guard_smoothing, args.turn_lambda) == (-5.0, 1.0, None)


def test_run_arguments_follow_the_same_rule():
    assert set(numeric_fields(RunArguments)) == set(RUN_NUMBER_RANGES)
    for name, bad in (("warm_start_noise", math.nan), ("warm_start_episodes", 1.5), ("warm_start_noise", 1.5)):
        with pytest.raises(ValueError, match=f"^{name}="):
            RunArguments(**{name: bad})
    assert RunArguments(warm_start_episodes=8, warm_start_noise=1.0).warm_start_noise == 1.0


def test_a_numeric_field_without_a_declared_range_fails_at_definition():
    @dataclass
    class Settings:
        steps: int = 1
        rate: float | None = field(default=None)
        name: str = "x"
        flag: bool = False

    assert numeric_fields(Settings) == {"steps": (int, False), "rate": (float, True)}
    with pytest.raises(TypeError, match=r"without a declared range \['rate'\]"):
        check_declared(Settings, {"steps": Range(1)})
    with pytest.raises(TypeError, match=r"ranges of no such field \['name'\]"):
        check_declared(Settings, {"steps": Range(1), "rate": Range(), "name": Range()})
    check_declared(Settings, {"steps": Range(1), "rate": Range()})


def test_range_bounds_and_text():
    assert (
        str(Range(0, 1)) == "[0, 1]" and str(Range(0, low_open=True)) == "(0, inf)" and str(Range()) == "(-inf, inf)"
    )
    assert str(Range(None, 0)) == "(-inf, 0]"
    assert 0 in Range(0, 1) and 1 in Range(0, 1) and 0 not in Range(0, 1, low_open=True)
    assert 1 not in Range(0, 1, high_open=True) and -0.5 not in Range(0) and 7 in Range()
    check_number("x", 3, int, False, Range(1))
    with pytest.raises(ValueError, match=r"^x=0 is outside \[1, inf\): give a whole number in \[1, inf\)\.$"):
        check_number("x", 0, int, False, Range(1))
