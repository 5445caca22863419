"""The experiments' scripts (experiments/): how each records its runs and renders its section of
experiments/README.md, and the reading probes' scoring."""

import json
import pathlib
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the experiments run as modules of the checkout: python -m experiments.NAME


@pytest.fixture(autouse=True)
def _readme_copy(tmp_path, monkeypatch):
    """The scripts rewrite README.md's real-model table with their report: tests write a copy."""
    from experiments import report

    copy = tmp_path / "README.md"
    copy.write_text((ROOT / "README.md").read_text())
    monkeypatch.setattr(report, "README", copy)
    benchmarks = tmp_path / "BENCHMARKS.md"  # and BENCHMARKS.md's real-model block
    benchmarks.write_text((ROOT / "BENCHMARKS.md").read_text())
    monkeypatch.setattr(report, "BENCHMARKS", benchmarks)


def test_record_writes_the_run_entry_and_table(tmp_path, monkeypatch):
    from experiments import real_model, report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    monkeypatch.setattr(real_model, "HERE", tmp_path)
    recipe = tmp_path / "smollm2-cpu-x.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {"env_id": "starpo/Bandit-v0", "warm_start_episodes": 8, "warm_start_noise": 1.0, "use_peft": True}
        )
    )
    run = tmp_path / "run"
    run.mkdir()
    history = [
        {
            "step": 1,
            "step_time": 50.0,
            "env/Bandit-v0/success": 0.5,
            "env/Bandit-v0/format_error_rate": 0.25,
            "entropy": 0.3,
        },
        {"step": 2, "step_time": 20.0},
        {"step": 3, "step_time": 30.0, "env/Bandit-v0/success": 0.75},
    ]
    (run / "report.json").write_text(
        json.dumps(
            {
                "env_id": "starpo/BanditTest-v0",
                "success_before": 0.5,
                "success_after": 0.875,
                "episodes": 256,
                "before": {"success": 0.5, "format_error_rate": 0.125},
                "after": {"success": 0.875, "format_error_rate": 0.0},
                "wall_seconds": 100.0,
                "log_history": history,
            }
        )
    )
    entry = real_model.record(str(recipe), str(run), peak_rss_mib=1234.4)
    assert entry["start"] == "sft" and "format only" in entry["warm_start"] and entry["lora"]
    assert (entry["success_before"], entry["success_after"]) == (0.5, 0.875)
    assert (entry["format_error_before"], entry["format_error_after"]) == (0.125, 0.0)
    assert entry["max_steps"] == 3 and entry["step_seconds_median"] == 30.0 and entry["peak_rss_mib"] == 1234
    assert (tmp_path / "figures" / "real-smollm2-cpu-x.png").read_bytes()[:4] == b"\x89PNG"
    stored = json.loads((tmp_path / "results.json").read_text())["real_model"]["runs"]
    assert stored == [entry]
    # flags override the recipe's settings in the entry
    flagged = real_model.record(str(recipe), str(run), flags=["--use_peft", "false", "--warm_start_episodes", "0"])
    assert (flagged["lora"], flagged["start"], flagged["warm_start"]) == (False, "base", None)
    assert flagged["flags"] == "--use_peft false --warm_start_episodes 0"
    real_model.record(str(recipe), str(run))  # the same recipe and flags again replace their entry
    assert len(json.loads((tmp_path / "results.json").read_text())["real_model"]["runs"]) == 2
    table = (tmp_path / "REPORT.md").read_text()
    assert "| `recipes/smollm2-cpu-x.yaml` | `starpo/Bandit-v0` | `starpo/BanditTest-v0` | sft" in table
    assert "0.500 -> 0.875 | 0.125 -> 0.000 | 3 | 30.0 |" in table
    assert "- `recipes/smollm2-cpu-x.yaml`:" not in table  # no note, no line
    real_model.record(str(recipe), str(run), note="another job shared the CPU in steps 1-2")
    (noted,) = [r for r in json.loads((tmp_path / "results.json").read_text())["real_model"]["runs"] if not r["flags"]]
    assert noted["note"].startswith("another")
    assert (
        "- `recipes/smollm2-cpu-x.yaml`: another job shared the CPU in steps 1-2"
        in (tmp_path / "REPORT.md").read_text()
    )


def test_record_keeps_each_eval_env_and_each_set_of_flags(tmp_path, monkeypatch):
    from experiments import real_model, report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    monkeypatch.setattr(real_model, "HERE", tmp_path)
    recipe = tmp_path / "smollm2-cpu-y.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "env_id": "starpo/BanditSymbolic-v0",
                "warm_start_episodes": 8,
                "eval_env_configs": [
                    {"env_id": "starpo/BanditSymbolicTest-v0"},
                    {"env_id": "starpo/BanditSymbolic-v0"},
                ],
            }
        )
    )
    run = tmp_path / "run"
    run.mkdir()

    def metrics(train, test):
        return {
            "success": (train + test) / 2,
            "format_error_rate": 0.0,
            "BanditSymbolic-v0/success": train,
            "BanditSymbolic-v0/format_error_rate": 0.5,
            "BanditSymbolicTest-v0/success": test,
            "BanditSymbolicTest-v0/format_error_rate": 0.25,
        }

    out = {  # train.py's report.json with several eval envs: no top-level env_id, the pool named as such
        "env_id": None,
        "eval_env_ids": ["starpo/BanditSymbolicTest-v0", "starpo/BanditSymbolic-v0"],
        "pooled_success_before": 0.5,
        "pooled_success_after": 0.75,
        "episodes": 256,
        "before": metrics(0.25, 0.75),
        "after": metrics(1.0, 0.5),
        "wall_seconds": 10.0,
        "log_history": [{"step": 1, "step_time": 5.0, "env/BanditSymbolic-v0/success": 0.5}],
    }
    (run / "report.json").write_text(json.dumps(out))
    think = real_model.record(str(recipe), str(run))
    plain = real_model.record(str(recipe), str(run), flags=["--enable_think", "false"])
    assert (plain["success_before"], plain["success_after"]) == (0.75, 0.5)  # the first of eval_env_configs
    assert plain["eval_env_id"] == "starpo/BanditSymbolicTest-v0"
    assert plain["eval_envs"]["BanditSymbolic-v0"] == {
        "success_before": 0.25,
        "success_after": 1.0,
        "format_error_before": 0.5,
        "format_error_after": 0.5,
    }
    assert plain["flags"] == "--enable_think false" and plain["curves"] == "real-smollm2-cpu-y-enable-think-false.png"
    assert think["flags"] == "" and think["curves"] == "real-smollm2-cpu-y.png"
    runs = json.loads((tmp_path / "results.json").read_text())["real_model"]["runs"]
    assert [r["flags"] for r in runs] == ["", "--enable_think false"]  # other flags: another entry
    table = (tmp_path / "REPORT.md").read_text()
    assert "| `recipes/smollm2-cpu-y.yaml` `--enable_think false` |" in table
    assert (
        "| `recipes/smollm2-cpu-y.yaml` `--enable_think false` | BanditSymbolic-v0 | 0.250 -> 1.000 | 0.500 -> 0.500 |"
        in table
    )


def test_real_model_speed_rows(tmp_path, monkeypatch):
    from experiments import report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    rows = {
        "model": "M",
        "rollout_overhead_ratio": 0.61,
        "kv_reuse_speedup": 1.9,
        "rollout_seconds": {"kv_reuse_off": 80.0, "kv_reuse_on": 42.1, "bare_generate": 70.5},
        "prefill_tokens_per_episode_by_turn": [200.4, 290.0],
        "prefill_tokens_per_episode_by_turn_kv_reuse": [200.4, 66.6],
        "step_time_ratio_vs_trl_grpo": 1.2,
        "step_seconds": {"starpo": 30.0, "trl": 25.0},
        "mean_completion_tokens": {"starpo": 32.0, "trl": 32.0},
    }
    report.store("real_model", rows, seeds=None)
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["real_model"]["kv_reuse_speedup"] == 1.9
    assert "kv_reuse_speedup" not in stored  # the top-level headline ratios are make bench's (the tiny model's)
    text = (tmp_path / "REPORT.md").read_text()
    assert "x 24 tokens) | 0.61 | <= 1.10: met |" in text
    assert "| kv_reuse_speedup (the same episodes, engine with KV reuse off / on) | 1.90 | > 1: met |" in text
    assert "32 tokens) | 1.20 | <= 1.15: NOT met |" in text
    prose = " ".join(text.split())  # paragraphs are wrapped at 119 characters
    assert "KV reuse off 80.0, on 42.1, bare `model.generate` 70.5" in prose
    assert "the whole history turn 1: 200, turn 2: 290; with KV reuse turn 1: 200, turn 2: 67." in prose
    # the speed run's own provenance (an RL run stored later rewrites the section's) names where it was measured
    rows["speed_provenance"] = {
        "machine": "m",
        "measured_at": "2026-12-06 21:51 UTC",
        "commit": "92dc410aaaa",
        "dirty": False,
    }
    report.store("real_model", rows, seeds=None)
    assert (
        "Speed (`python -m experiments.real_model speed` (m, 2026-12-06 21:51 UTC, commit 92dc410))"
        in (tmp_path / "REPORT.md").read_text()
    )


def test_mi_warm_starts_table(tmp_path, monkeypatch):
    from experiments import report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    row = {
        "success": 0.25,
        "example_reply": "<think>The best action is Down.</think><answer>Down</answer>",
        "mi_estimate": 0.2,
        "retrieval_accuracy": 0.125,
        "retrieval_chance": 0.0714,
        "num_inputs": 14.0,
        "num_reasonings": 32.0,
        "mi_per_pass": [0.1, 0.3],
        "mi_seconds": 20.4,
    }
    by_think = {"action": row, "state": {**row, "mi_estimate": 1.5, "mi_per_pass": [1.4, 1.6]}}
    report.store(
        "mi_warm_starts", {"lakes": 8, "per_lake": 4, "rollouts": 2, "noise": 0.1, "by_think": by_think}, seeds=[0, 1]
    )
    text = (tmp_path / "REPORT.md").read_text()
    assert "| action | 0.250 | 0.200 (0.10, 0.30) | 0.125 | 0.071 | 14 x 32 | 20 |" in text
    assert "| state | 0.250 | 1.500 (1.40, 1.60) |" in text
    assert "- action: `<think>The best action is Down.</think><answer>Down</answer>`" in text


def test_filter_strategies_table(tmp_path, monkeypatch):
    from experiments import report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    runs = [
        {
            "strategy": s,
            "seed": seed,
            "final_success": f,
            "kept_fraction_mean": k,
            "empty_after_filter_steps": e,
            "wall_seconds": 10.0,
        }
        for s, seed, f, k, e in [
            ("a", 0, 0.5, 0.25, 0),
            ("a", 1, 0.7, 0.25, 0),
            ("b", 0, 0.4, 0.6, 2),
            ("b", 1, 0.4, 0.5, 0),
        ]
    ]
    summary = {"a": {"mean": 0.6, "spread": 0.2}, "b": {"mean": 0.4, "spread": 0.0}}
    env = {"runs": runs, "summary": summary, "ordering": ["a", "b"], "png": "benchmarks/x.png"}
    report.store("filter_strategies", {"per_env": {"starpo/FrozenLake-v0": env}, "strategies": {}}, seeds=[0, 1])
    text = (tmp_path / "REPORT.md").read_text()
    assert "| `starpo/FrozenLake-v0` | a | 0.600 | 0.200 | 0.500, 0.700 | 0.25 | 0, 0 | 10 |" in text
    assert "| `starpo/FrozenLake-v0` | b | 0.400 | 0.000 | 0.400, 0.400 | 0.55 | 2, 0 | 10 |" in text
    assert "ordering by mean final success: a > b." in text


def test_multi_env_table(tmp_path, monkeypatch):
    from experiments import report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    row = {
        "train_env": "starpo/Bandit-v0",
        "eval_env": "starpo/BanditTest-v0",
        "multi_env_success": 0.8,
        "single_env_success": 0.9,
        "single_env_wall_seconds": 61.0,
    }
    section = {
        "recipe": "recipes/x.yaml",
        "rows": [row],
        "multi_env_wall_seconds": 200.0,
        "max_steps": 60,
        "episodes": 256,
    }
    report.store("multi_env", section, seeds=[0])
    text = (tmp_path / "REPORT.md").read_text()
    assert "| `starpo/Bandit-v0` | `starpo/BanditTest-v0` | 0.800 | 0.900 | 61 |" in text
    assert "multi-env run 200 s" in text


def test_context_windows_table(tmp_path, monkeypatch):
    from experiments import report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    runs = [
        {"window": "full", "seed": s, "final_success": f, "tokens_per_step": 900.0, "wall_seconds": 5.0}
        for s, f in [(0, 0.3), (1, 0.5)]
    ]
    summary = {"full": {"mean": 0.4, "spread": 0.2, "tokens_per_step": 900.0}}
    report.store(
        "context_windows",
        {
            "per_env": {"starpo/FrozenLake-v0": {"runs": runs, "summary": summary}},
            "windows": ["full"],
        },
        seeds=[0, 1],
    )
    assert (
        "| `starpo/FrozenLake-v0` | full | 0.400 | 0.200 | 0.300, 0.500 | 900 |"
        in (tmp_path / "REPORT.md").read_text()
    )


@pytest.mark.parametrize(
    "section, part", [("credit_assignment", "credit"), ("refill", "refill"), ("overlong", "overlong")]
)
def test_comparison_tables(tmp_path, monkeypatch, section, part):
    from experiments import report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    run = dict(tokens_per_step=900.0, kept_fraction_mean=0.5, generated_per_trained=2.0, refill_rounds_mean=None)
    runs = [
        {**run, "variant": "A", "seed": 0, "final_success": 0.3, "wall_seconds": 10.0, "cut_turn_fraction": 0.1},
        {**run, "variant": "A", "seed": 1, "final_success": 0.6, "wall_seconds": 20.0, "cut_turn_fraction": 0.2},
        {**run, "variant": "B", "seed": 0, "final_success": 0.5, "wall_seconds": 30.0, "cut_turn_fraction": None},
        {**run, "variant": "B", "seed": 1, "final_success": 0.1, "wall_seconds": 30.0, "stopped": "step 7: 5 steps"},
    ]
    report.store(section, {"per_env": {"starpo/Sokoban-v0": {"runs": runs}}, "variants": {}}, seeds=[0, 1])
    text = (tmp_path / "REPORT.md").read_text()
    assert f"(`python -m experiments.learning {part}`" in text
    assert "| `starpo/Sokoban-v0` | A | 0.450 | 0.300, 0.600 | 15 (10-20) | 900 | 2.00 | 0.150 |" in text
    assert "| `starpo/Sokoban-v0` | B | 0.300 | 0.500, 0.100 | 30 (30-30) | 900 | 2.00 | - |" in text
    assert "evaluated as they stood: `starpo/Sokoban-v0` B, seed 1: step 7: 5 steps." in text


def test_collapse_real_summary_and_table(tmp_path, monkeypatch):
    """`collapse.py --real --replay` on a hand-made history: early success 0.4 over the first 10 rollouts,
    then 0.1, so the 5-rollout average first falls below 0.2 at step 14 ((0.4 + 4 x 0.1) / 5 = 0.16);
    MI passes every 2 steps at 3 s against 10-s steps: 15% of the step time. Raw crossings: retrieval's early
    level is its first 3 passes (0.75), threshold 0.375, first below at step 12 (0.25); I(X;Z) 0.5 -> 0.25, step
    12; the in-group reward std's early level is its first 10 logs (0.5), threshold 0.4 x 0.5 = 0.2: 0.3 in
    steps 11-14 is not below it, 0.1 from step 15 is; entropy is not logged, so it has no row."""
    from experiments import collapse, report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    monkeypatch.setattr(collapse, "OUT", tmp_path / "runs")
    monkeypatch.setattr(collapse, "ROOT", tmp_path)
    monkeypatch.setattr(collapse, "HERE", tmp_path / "experiments")
    (tmp_path / "experiments").mkdir()
    history = []
    for step in range(1, 21):
        row = {"step": step, "loss": 0.1, "step_time": 10.0, "env/FrozenLake-v0/success": 0.4 if step <= 10 else 0.1}
        row["env/FrozenLake-v0/group_reward_std_mean"] = 0.5 if step <= 10 else (0.3 if step <= 14 else 0.1)
        if step % 2 == 0:
            acc = 0.75 if step <= 10 else 0.25
            row.update(
                {
                    "collapse/retrieval_accuracy": acc,
                    "collapse/retrieval_chance": 0.25,
                    "collapse/mi_estimate": 0.5 if step <= 10 else 0.0,
                    "collapse/mi_estimate_per_token": 0.125 if step <= 10 else 0.0,
                    "collapse/mi_zscore": 9.0,  # RAGEN's statistic: not this table's column
                    "collapse/own_input_zscore": 1.5,
                    "collapse/mi_seconds": 3.0,
                }
            )
        history.append(row)
    (tmp_path / "runs" / "real-collapse").mkdir(parents=True)
    (tmp_path / "runs" / "real-collapse" / "report.json").write_text(
        json.dumps({"log_history": history, "wall_seconds": 200.0})
    )
    collapse.real(replay=True)
    stored = json.loads((tmp_path / "results.json").read_text())["collapse_real"]
    run = stored["run"]
    assert run["early_success"] == 0.4 and run["success_halved_step"] == 14
    assert run["mi_overhead"] == 0.15 and run["mi_passes"] == 10
    assert run["mi_retrieval_mean"] == 0.5 and run["mi_estimate_mean"] == 0.25
    assert [m["step"] for m in stored["mi_passes"]] == list(range(2, 21, 2))
    assert stored["steps"] == 20 and stored["planned_steps"] == collapse.REAL_RUNS["real-collapse"][2]["max_steps"]
    assert run["raw_crossings"] == {
        "reward_std": {"early": 0.5, "threshold": 0.2, "first_step": 15},
        "retrieval": {"early": 0.75, "threshold": 0.375, "first_step": 12},
        "mi_estimate": {"early": 0.5, "threshold": 0.25, "first_step": 12},
    }
    assert [r["step"] for r in stored["per_step"]] == list(range(1, 21))
    assert stored["per_step"][14]["env/FrozenLake-v0/group_reward_std_mean"] == 0.1
    text = (tmp_path / "REPORT.md").read_text()
    assert "| retrieval | 0.750 | 0.375 | 12 |" in text and "| reward_std | 0.500 | 0.200 | 15 |" in text
    # a replay re-judges the run but keeps the time it was measured
    results = json.loads((tmp_path / "results.json").read_text())
    results["collapse_real"]["measured_at"] = "2026-01-01 00:00 UTC"
    (tmp_path / "results.json").write_text(json.dumps(results))
    collapse.real(replay=True)
    assert (
        json.loads((tmp_path / "results.json").read_text())["collapse_real"]["measured_at"] == "2026-01-01 00:00 UTC"
    )
    text = (tmp_path / "REPORT.md").read_text()
    assert "(`python -m experiments.collapse --real`," in text
    assert (
        "| 12 | 0.250 | 0.250 | 0.000 | 0.000 | 1.50 |" in text
        and "| 10 | 0.750 | 0.250 | 0.500 | 0.125 | 1.50 |" in text
    )
    assert "| 0.400 |" in text and "| 14 | 15.0% | 200 |" in text
    # a second real-model run gets its own section, beside the first
    (tmp_path / "runs" / "real-5x").mkdir()
    (tmp_path / "runs" / "real-5x" / "report.json").write_text(
        json.dumps({"log_history": history[:12], "wall_seconds": 120.0})
    )
    collapse.real("real-5x", replay=True)
    both = json.loads((tmp_path / "results.json").read_text())
    assert both["collapse_real"]["steps"] == 20 and both["collapse_real_5x"]["steps"] == 12
    assert both["collapse_real_5x"]["planned_steps"] == collapse.REAL_RUNS["real-5x"][2]["max_steps"]
    text = (tmp_path / "REPORT.md").read_text()
    assert (
        "(`python -m experiments.collapse --real`," in text
        and "(`python -m experiments.collapse --real real-5x`," in text
    )
    # one section for the real-model runs (they were three near-identical ones): a row per run, then each run
    assert text.count("## Collapse guard and MI on the real model") == 1
    assert "| `--real` | 0.400 |" in text and "| `--real real-5x` |" in text


def test_bandit_reading_by_hand():
    import math

    import pytest

    from experiments import bandit_reading

    assert bandit_reading.best_probability(math.log(0.3), math.log(0.1)) == pytest.approx(0.75)
    assert bandit_reading.reading(0.9, 0.9) == 0.0  # the same name on both prompts: choosing by name
    assert bandit_reading.reading(1.0, 0.0) == 1.0 and bandit_reading.reading(0.2, 0.7) == pytest.approx(-0.5)


def test_reading_table_lists_probes_oldest_first_whatever_the_stored_order():
    from experiments import report

    def probe(at, reading):
        return {
            "measured_at": at,
            "pairs": [{"p_best": [1.0, reading]}],
            "test_reading": reading,
            "train_reading_mean": 0.5,
        }

    # results.json keeps labels sorted by name: "b-new" was measured before "a-later"
    lines = report.real_model_reading_lines(
        {"reading": {"a-later": probe("2026-12-06 01:41 UTC", 0.98), "b-new": probe("2026-12-05 11:38 UTC", 0.09)}}
    )
    rows = [line for line in lines if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["b-new", "a-later"]
    assert rows[0] == "| `b-new` | 2026-12-05 11:38 UTC | 1.00 | 0.09 | +0.09 | +0.50 |"


def test_bandit_reading_scores_the_engines_own_prompt_and_reads_a_name_preference_as_zero(tiny_tokenizer, scripted):
    """The probe's prompt for each side of a pair is the one the rollout engine renders for that seed, token
    for token; a model that prefers one name whatever the prompt says reads 0 and scores P(best) p and 1 - p."""
    from types import SimpleNamespace

    import torch

    from experiments import bandit_reading
    from starpo_trl.rollout.engine import RolloutConfig, RolloutEngine, StartState
    from starpo_trl.warm_start import expert_reply

    eos = tiny_tokenizer.eos_token_id
    engine = RolloutEngine(tiny_tokenizer, None, RolloutConfig(max_turns=1, enable_think=False), [eos])
    kwargs = {"arm_names": [["Dragon", "Phoenix"], ["Lion", "Eagle"]], "expected_reward": True, "mirror_seeds": True}
    for pair in (("Dragon", "Phoenix"), ("Tiger", "Crane")):
        for risky in (0, 1):
            seed, prompt, names = bandit_reading.side_prompts(engine, kwargs, pair, risky)
            start = StartState("starpo/Bandit-v0", seed, (("arm_names", pair), ("expected_reward", True)))
            (ep,) = engine.run([start], backend=scripted(f"<answer> {pair[risky]}</answer>"))
            assert ep.prompt_ids == prompt and names == list(pair)
            assert ep.success and ep.turn_rewards == [0.25]  # the seed shows pair[risky] as the risky (better) arm

    def ids(name):
        return tiny_tokenizer(expert_reply([name], False, True), add_special_tokens=False)["input_ids"]

    dragon = sorted(set(ids("Dragon")) - set(ids("Phoenix")))

    class PrefersDragon(torch.nn.Module):  # the same logits whatever the prompt: +8 on Dragon's tokens
        def forward(self, x):
            logits = torch.zeros(1, x.shape[1], len(tiny_tokenizer))
            logits[..., dragon] = 8.0
            return SimpleNamespace(logits=logits)

    (row,) = bandit_reading.probe(PrefersDragon(), engine, kwargs, [("Dragon", "Phoenix")], space_before_answer=True)
    assert row["reading"] == 0.0 and row["p_best"][0] > 0.99 and row["p_best"][0] + row["p_best"][1] == 1.0


def test_bandit_reading_scores_the_prompt_and_reply_training_plays_with_a_prefix_and_an_instruction(
    tiny_tokenizer, scripted
):
    """With ``reply_prefix`` and ``format_instruction`` the probe's prompt is still the engine's own (ending with
    the prefix) and the scored answer goes on from the prefix, as the model's sampled replies did."""
    from types import SimpleNamespace

    import torch

    from experiments import bandit_reading
    from starpo_trl.rollout.engine import RolloutConfig, RolloutEngine, StartState

    eos = tiny_tokenizer.eos_token_id
    instruction = "Name one arm, e.g. <answer> {example_action} </answer>"
    cfg = RolloutConfig(max_turns=1, enable_think=False, reply_prefix="auto", format_instruction=instruction)
    engine = RolloutEngine(tiny_tokenizer, None, cfg, [eos])
    kwargs = {"arm_names": [["Dragon", "Phoenix"]], "expected_reward": True}
    seed, prompt, _ = bandit_reading.side_prompts(engine, kwargs, ("Dragon", "Phoenix"), 0)
    start = StartState("starpo/Bandit-v0", seed, (("arm_names", ("Dragon", "Phoenix")), ("expected_reward", True)))
    (ep,) = engine.run([start], backend=scripted(" Dragon</answer>"))
    assert ep.prompt_ids == prompt and ep.success
    assert tiny_tokenizer.decode(prompt).endswith(
        "e.g. <answer> Dragon </answer><|im_end|>\n<|im_start|>assistant\n<answer>"
    )
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, x):
            seen.append(x[0].tolist())
            return SimpleNamespace(logits=torch.zeros(1, x.shape[1], len(tiny_tokenizer)))

    bandit_reading.probe(Recorder(), engine, kwargs, [("Dragon", "Phoenix")], space_before_answer=True)
    reply = tiny_tokenizer(" Dragon</answer>", add_special_tokens=False)["input_ids"]
    assert seen[0] == prompt + reply  # the first side, Dragon risky, first name scored first


def test_bandit_reading_probes_the_pairs_training_sees():
    """The probe reads the recipe's env as training builds it: registry kwargs, then the recipe's; Tiger / Crane
    first, then each training pair once (a single pair is one pair, not pairs of letters)."""
    from experiments import bandit_reading

    many = {"arm_names": [["Dragon", "Phoenix"], ["Lion", "Eagle"]], "mirror_seeds": True}
    kwargs, pairs = bandit_reading.probed_pairs("starpo/Bandit-v0", many)
    assert pairs == [("Tiger", "Crane"), ("Dragon", "Phoenix"), ("Lion", "Eagle")] and kwargs["mirror_seeds"]
    _, pairs = bandit_reading.probed_pairs("starpo/Bandit-v0", {"arm_names": ["Wolf", "Owl"]})
    assert pairs == [("Tiger", "Crane"), ("Wolf", "Owl")]
    kwargs, pairs = bandit_reading.probed_pairs("starpo/BanditTest-v0", {"expected_reward": True})
    assert pairs == [("Tiger", "Crane")] and kwargs == {"arm_names": ("Tiger", "Crane"), "expected_reward": True}


def test_bandit_reading_table_row():
    from experiments import report

    pairs = [{"pair": ["Tiger", "Crane"], "p_best": [0.6, 0.49], "mass": [0.96, 0.96], "reading": 0.09}]
    entry = {"measured_at": "2026-12-05 12:00 UTC", "pairs": pairs, "test_reading": 0.09, "train_reading_mean": -0.02}
    lines = report.real_model_reading_lines({"reading": {"try 9": entry}})
    assert "| `try 9` | 2026-12-05 12:00 UTC | 0.60 | 0.49 | +0.09 | -0.02 |" in lines
    assert report.real_model_reading_lines({}) == []


def test_rl_probes_reading_only_for_payout_bandit_recipes(monkeypatch):
    """`real_model.py rl` follows a payout-Bandit run (no <think>) with the reading probe, on the run's own
    directory and flags; other recipes, and the same recipe with <think>, are not probed."""
    from experiments import bandit_reading, real_model
    from starpo_trl import offline_model

    calls = []
    monkeypatch.setattr(offline_model, "build", lambda: None)
    monkeypatch.setattr(real_model.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(real_model, "record", lambda recipe, run_dir, peak, flags: {"recipe": recipe})
    monkeypatch.setattr(bandit_reading, "main", calls.append)
    mirror = "experiments/recipes/smollm2-cpu-bandit-pairs-mirror.yaml"
    real_model.rl(mirror, ["--max_steps", "100", "--output_dir", "runs/m100"])
    assert calls == [[mirror, str(real_model.ROOT / "runs/m100"), "--label", "runs/m100", "--max_steps", "100"]]
    real_model.rl(mirror, ["--enable_think", "true"])
    real_model.rl("recipes/smollm2-cpu-frozenlake.yaml", [])
    real_model.rl("experiments/recipes/smollm2-cpu-bandit-symbolic-lora.yaml", [])
    assert len(calls) == 1


def test_collapse_real_run_stops_at_its_time_budget():
    """`collapse.py --real` ends training at the first step end past its budget (its report is still written)."""
    import time

    from transformers import TrainerControl

    from experiments import collapse

    over = collapse.StopAfter(budget_s=60.0, start=time.time() - 61.0)
    assert over.on_step_end(None, None, TrainerControl()).should_training_stop
    within = collapse.StopAfter(budget_s=60.0, start=time.time() - 30.0)
    assert not within.on_step_end(None, None, TrainerControl()).should_training_stop


def test_runs_of_one_recipe_on_several_seeds_are_summarised():
    """Mean (min-max) over seeds per eval env, and how many runs met the target (0.9 after RL on a Bandit env; +10
    points over the run's own before elsewhere); a recipe run once is not summarised."""
    from experiments import report

    def run(seed, flags, test_after, heldout_after):
        return {
            "recipe": "recipes/r.yaml",
            "flags": flags,
            "eval_env_id": "starpo/BanditTest-v0",
            "success_before": 0.5,
            "success_after": test_after,
            "eval_envs": {
                "BanditTest-v0": {"success_before": 0.5, "success_after": test_after},
                "BanditHeldout-v0": {"success_before": 0.25, "success_after": heldout_after},
            },
            "provenance": {"seeds": [seed]},
        }

    runs = [run(0, "", 1.0, 0.95), run(1, "--seed 1", 0.75, 0.85), run(2, "--lr 2 --seed 2", 0.5, 0.5)]
    runs.append({**run(0, "--other x", 1.0, 1.0)})  # another set of flags, one seed: no summary
    assert report.without_seed("--lr 2 --seed 2 --x y") == "--lr 2 --x y" and report.without_seed("--seed 3") == ""
    groups = report.seed_groups(runs)
    assert list(groups) == [("recipes/r.yaml", "")] and len(groups[("recipes/r.yaml", "")]) == 2
    lines = report.real_model_seed_lines({"runs": runs})
    assert "| `recipes/r.yaml` | BanditTest-v0 | 0, 1 | 0.500 (0.500-0.500) | 0.875 (0.750-1.000) | 1 of 2 |" in lines
    assert (
        "| `recipes/r.yaml` | BanditHeldout-v0 | 0, 1 | 0.250 (0.250-0.250) | 0.900 (0.850-0.950) | 1 of 2 |" in lines
    )
    assert report.real_model_seed_lines({"runs": runs[3:]}) == []

    def lake(seed, before, after):  # FrozenLake: the target is a gain of 10 points, not 0.9
        return {
            "recipe": "recipes/lake.yaml",
            "flags": f"--seed {seed}" if seed else "",
            "eval_env_id": "starpo/FrozenLake-v0",
            "success_before": before,
            "success_after": after,
            "provenance": {"seeds": [seed]},
        }

    lakes = [lake(0, 0.2, 0.35), lake(1, 0.25, 0.3), lake(2, 0.1, 0.2)]  # gains 0.15, 0.05, 0.10: two met
    lines = report.real_model_seed_lines({"runs": lakes})
    assert (
        "| `recipes/lake.yaml` | starpo/FrozenLake-v0 | 0, 1, 2 | 0.183 (0.100-0.250) | 0.283 (0.200-0.350) | 2 of 3 |"
        in lines
    )


def test_the_readme_shows_a_runs_other_eval_env_when_it_was_played():
    """A README row may name one of a run's eval envs: it shows that env's before/after, and is left out for a run
    stored before that env was played."""
    from experiments import report

    x = {
        "recipe": "recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml",
        "flags": "",
        "success_before": 0.5,
        "success_after": 1.0,
        "format_error_before": 0.03,
        "format_error_after": 0.0,
        "max_steps": 70,
        "wall_seconds": 3000.0,
        "provenance": {"seeds": [0]},
        "eval_envs": {
            "BanditHeldout-v0": {
                "success_before": 0.25,
                "success_after": 0.75,
                "format_error_before": 0.5,
                "format_error_after": 0.125,
            }
        },
    }
    lines = report.real_model_table({"real_model": {"runs": [x]}})
    heldout = [line for line in lines if "16 held-out name pairs" in line]
    assert heldout and "0.250 -> **0.750** (+50.0 points); format errors 0.500 -> 0.125" in heldout[0]
    assert not [line for line in lines if "BanditPayoutsHeldout-v0" in line]  # not played in this run
    assert any("0.500 -> **1.000**" in line for line in lines)  # the run's headline env


def test_the_readme_shows_a_recipe_run_on_several_seeds_as_means_with_the_range_after():
    """README rows of a recipe run on seeds 0 and 1 (its flags with --seed N): the means before and after, the gain of
    the means, the range after RL, both runs' steps and minutes; a run with other flags is not one of its seeds; the
    next row (another eval env of the same runs) does not name the recipe again."""
    from experiments import report

    def run(seed, flags, before, after, minutes, heldout_after):
        return {
            "recipe": "recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml",
            "flags": flags,
            "success_before": before,
            "success_after": after,
            "format_error_before": 0.25,
            "format_error_after": 0.0625,
            "max_steps": 70,
            "wall_seconds": 60.0 * minutes,
            "provenance": {"seeds": [seed]},
            "eval_envs": {
                "BanditHeldout-v0": {
                    "success_before": 0.5,
                    "success_after": heldout_after,
                    "format_error_before": 0.5,
                    "format_error_after": 0.0,
                }
            },
        }

    runs = [
        run(0, "", 0.5, 1.0, 100, 0.75),
        run(1, "--seed 1", 0.25, 0.5, 130, 1.0),
        run(0, "--lr 1", 0.0, 0.0, 5, 0.0),
    ]
    lines = report.real_model_table({"real_model": {"runs": runs}})
    test = [line for line in lines if "BanditTest" in line]
    # before (0.5 + 0.25) / 2, after (1.0 + 0.5) / 2: +37.5 points; format errors the same on both seeds
    assert test == [
        "| Bandit from the model as it is (no SFT); BanditTest (one unseen name pair) "
        "(`recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml`) | 0.375 -> **0.750** (+37.5 points; "
        "0.500-1.000 after); format errors 0.250 -> 0.062 | 70 steps, 100-130 min, seeds 0, 1 |"
    ]
    heldout = [line for line in lines if "16 held-out name pairs" in line]
    assert heldout == [
        "| the same policies on 16 held-out name pairs (`BanditHeldout-v0`) | 0.500 -> **0.875** (+37.5 points; "
        "0.750-1.000 after); format errors 0.500 -> 0.000 | 70 steps, 100-130 min, seeds 0, 1 |"
    ]


def test_benchmarks_md_shows_each_readme_run_with_its_provenance_and_is_rewritten_as_runs_are_stored(
    tmp_path, monkeypatch
):
    """BENCHMARKS.md's real-model block: README's table, then one row per run of its rows (seed, before -> after,
    wall, commit, time, the command without the options `record` adds); written again whenever the experiments'
    report is; the benchmarks' own sections stay as they were, and their renderer keeps the block as written."""
    from experiments import report

    def run(seed, command, dirty):
        return {
            "recipe": "experiments/recipes/smollm2-cpu-frozenlake-format-only.yaml",
            "flags": f"--seed {seed}" if seed else "",
            "success_before": 0.125,
            "success_after": 0.5 + seed / 8,
            "format_error_before": 0.25,
            "format_error_after": 0.0,
            "max_steps": 20,
            "wall_seconds": 60.0 * (40 + seed),
            "provenance": {
                "seeds": [seed],
                "commit": f"{seed}" * 40,
                "dirty": dirty,
                "measured_at": f"2026-12-0{seed + 1} 10:00 UTC",
                "command": command,
            },
        }

    results = {
        "real_model": {
            "runs": [
                run(0, "python -m experiments.real_model rl X.yaml", False),
                run(1, "python -m experiments.real_model record X.yaml runs/r --peak_rss_mib 9 --note Shared. --seed 1", True),
            ]
        }
    }  # fmt: skip
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    monkeypatch.setattr(report, "render", lambda results: "")  # experiments/README.md needs whole run entries
    report.write(results)
    text = report.BENCHMARKS.read_text()
    section = text[text.index("## Learning on the real model") : text.index("## Environment speed")]
    assert (
        "| FrozenLake 3x3, warm start on random moves (`experiments/recipes/smollm2-cpu-frozenlake-format-only"
        in section
    )
    assert "0.125 -> **0.562** (+43.8 points; 0.500-0.625 after)" in section  # the means of 0.5 and 0.625
    assert (
        "| FrozenLake 3x3, warm start on random moves | 0 | 0.125 -> 0.500 | 0.250 -> 0.000 | 40 min | 0000000 | "
        "2026-12-01 10:00 UTC | `python -m experiments.real_model rl X.yaml` |" in section
    )
    assert (
        "| FrozenLake 3x3, warm start on random moves | 1 | 0.125 -> 0.625 | 0.250 -> 0.000 | 41 min | 1111111 + "
        "uncommitted changes | 2026-12-02 10:00 UTC | `python -m experiments.real_model record X.yaml runs/r` |"
        in section
    )
    assert "`record` runs were trained earlier" in section and "Shared." not in section
    outside = lambda t: t[: t.index("## Learning on the real model")] + t[t.index("## Environment speed") :]  # noqa: E731
    assert outside(text) == outside((ROOT / "BENCHMARKS.md").read_text())
    from benchmarks import report as benchmarks_report

    monkeypatch.setattr(benchmarks_report, "MARKDOWN", report.BENCHMARKS)
    assert benchmarks_report.render(benchmarks_report.load()) == text  # a benchmark stored later keeps the block
    empty = report.benchmarks_lines({})
    assert "Not measured yet: `make bench-real`." in empty and not any(line.startswith("| row |") for line in empty)


def test_make_bench_real_runs_every_readme_row_on_every_seed_it_shows():
    """`make bench-real` reproduces README's real-model table: each row's recipe and flags, on each seed stored for it."""
    from experiments import report

    text = (ROOT / "Makefile").read_text()
    target = text[text.index("bench-real:") :].split("\n\n")[0]
    runs = [line.split(" rl ", 1)[1] for line in target.splitlines() if "experiments.real_model rl " in line]
    stored = report.load()["real_model"]["runs"]
    for recipe, flags, *_ in report.README_RUNS:
        for x in report.readme_row_runs(stored, recipe, flags) or [{"provenance": {"seeds": [0]}}]:
            seed = x["provenance"]["seeds"][0]
            want = f"{recipe}{' ' + flags if flags else ''}{f' --seed {seed}' if seed else ''}"
            assert any(r == want or r.startswith(want + " --output_dir ") for r in runs), (want, runs)


def test_critic_recipe_summary_by_hand_and_table(tmp_path, monkeypatch):
    """experiments/critic.py: explained variance and between-group share over windows of 20 steps, peak, steps above
    0.3, the last 20 steps' values and returns std (worked out here from a made-up log); a second estimator's run
    is stored beside the first, which keeps its own provenance."""
    from experiments import critic, report

    log = []
    for step in range(1, 41):
        ev = 0.0 if step <= 20 else (0.5 if step % 2 else 0.1)  # steps 21-40: ten at 0.5, ten at 0.1
        row = {
            "step": step,
            "critic/explained_variance": ev,
            "values/std": 0.2,
            "returns/std": 0.4 + (step > 20) * 0.1,
        }
        row["env/FrozenLake-v0/reward_between_group_share"] = 0.1 if step <= 20 else 0.7
        log += [row, {"step": step, "eval_loss": 1.0}]  # rows without the keys are skipped
    got = critic.summarise(log, 0.25, 0.5, "FrozenLake-v0")
    assert got == {
        "success_before": 0.25,
        "success_after": 0.5,
        "steps": 40,
        "explained_variance_by_window": [0.0, 0.3],  # (10 x 0.5 + 10 x 0.1) / 20
        "explained_variance_peak": 0.5,
        "steps_above_0_3": 10,
        "values_std_last": 0.2,
        "returns_std_last": 0.5,
        "between_group_share_by_window": [0.1, 0.7],
    }
    assert critic.windows([1.0, 2.0, 3.0], 2) == [1.5, 3.0]

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    monkeypatch.setattr(critic, "OUT", tmp_path / "runs")
    first = {**got, "flags": [], "wall_seconds": 2700.0, "provenance": {"commit": "aaaaaaa"}}
    monkeypatch.setattr(critic, "run", lambda variant: first)
    critic.main(["gae"])
    second = {**got, "flags": ["--advantage_estimator", "bilevel_gae"], "wall_seconds": 3600.0, "provenance": {}}
    monkeypatch.setattr(critic, "run", lambda variant: second)
    critic.main(["bilevel_gae"])
    stored = report.read(tmp_path / "results.json")["critic_recipe"]
    assert stored["runs"]["gae"]["provenance"] == {"commit": "aaaaaaa"} and set(stored["runs"]) == {
        "gae",
        "bilevel_gae",
    }
    text = (tmp_path / "REPORT.md").read_text()
    assert "## The critic where the return can be learned (`python -m experiments.critic [ESTIMATOR]`" in text
    assert "| `gae` | `-` | 0.250 -> 0.500 | 0.00, 0.30 | 0.50 | 10 of 40 | 0.10, 0.70 | 0.20 / 0.50 | 2700 |" in text
    assert "| `bilevel_gae` | `--advantage_estimator bilevel_gae` | 0.250 -> 0.500 |" in text


@pytest.mark.parametrize(
    "message, stops",
    [("5 steps in a row had no model token", True), ("boom", False), ("3 steps in a row failed elsewhere", False)],
)
def test_a_run_ended_by_a_stop_rule_is_evaluated_and_marked_and_other_errors_raise(
    tmp_path, monkeypatch, message, stops
):
    """learning.run_from: a trainer stop rule (TrainingStopped) ends that run only: the model is evaluated as it
    stands and the metrics say where and why it stopped; any other error, whatever its words, is raised."""
    from types import SimpleNamespace

    import transformers

    import starpo_trl
    from experiments import learning
    from starpo_trl.monitoring.empty_steps import TrainingStopped

    class Stopping:
        def __init__(self, model, args, processing_class):
            self.state = SimpleNamespace(global_step=3)

        def train(self):
            raise (TrainingStopped if stops else RuntimeError)(message)

        def evaluate_success(self):
            return {"success": 0.25}

    monkeypatch.setattr(starpo_trl, "MultiTurnStarPOTrainer", Stopping)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda path: None)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: None)
    if not stops:
        with pytest.raises(RuntimeError, match=message):
            learning.run_from(tmp_path, None)
        return
    _, final = learning.run_from(tmp_path, None)
    assert final == {"success": 0.25, "stopped": "step 3: 5 steps in a row had no model token"}


def test_answer_counts_by_hand():
    """experiments.answers.answer_counts: each model turn counted once, by its first action (case and spaces as
    the env ignores them), an answer that is no action, or no answer in the format; env messages are skipped."""
    from types import SimpleNamespace

    from envs.base import TextEnv
    from experiments.answers import answer_counts

    def episode(*replies):
        messages = [{"role": "user", "content": "<answer>Left</answer>"}]  # an env message: not counted
        for reply in replies:
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "State"}]
        return SimpleNamespace(messages=messages)

    episodes = [
        episode("<answer>Down</answer>", "<answer> up </answer>", "<answer>G</answer>"),
        episode("<answer>\n\nYou are walking", "<answer>DownRight</answer>", "<answer>Down || Up</answer>"),
    ]

    class Moves(TextEnv):  # the project's own action matching, over the names given
        def __init__(self, names):
            super().__init__()
            self.action_names = names

    counts = answer_counts(episodes, Moves(["Left", "Down", "Right", "Up"]), enable_think=False)
    assert counts == {"Left": 0, "Down": 2, "Right": 0, "Up": 1, "other": 2, "no answer": 1}
    think = [episode("<think>go</think><answer>Right</answer>", "<answer>Right</answer>")]
    assert answer_counts(think, Moves(["Left", "Right"]), enable_think=True) == {
        "Left": 0, "Right": 1, "other": 0, "no answer": 1
    }  # fmt: skip


def test_answers_plays_each_line_and_temperature_and_renders_shares(tmp_path, monkeypatch):
    """experiments.answers on the tiny model (untrained: it writes no answer), two format lines x one temperature,
    stored with provenance and rendered as shares of the model turns."""
    import json

    from experiments import answers, report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    monkeypatch.setattr(report, "README", tmp_path / "README.md")
    (tmp_path / "README.md").write_text("readme\n")
    recipe = tmp_path / "lake.yaml"
    recipe.write_text(
        'model_name_or_path: tiny\nenv_id: starpo/FrozenLake-v0\nenv_kwargs: \'{"is_slippery": false, "size": 3}\'\n'
        "output_dir: runs/x\nmax_turns: 2\nmax_tokens_per_turn: 4\nenable_think: false\nuse_cpu: true\n"
        "report_to: none\n"
    )
    lines = ["Reply with one of {actions}", "Answer: {actions}"]
    answers.main(
        [str(recipe), "--episodes", "3", "--temperatures", "1.0", "--mover_episodes", "256", "--lines", *lines]
    )
    stored = json.loads((tmp_path / "results.json").read_text())["answers"]["recipes"]["recipes/lake.yaml"]
    assert stored["actions"] == ["Left", "Down", "Right", "Up"] and stored["env_kwargs"] == {
        "is_slippery": False,
        "size": 3,
    }
    assert [(r["format_instruction"], r["temperature"]) for r in stored["rows"]] == [(lines[0], 1.0), (lines[1], 1.0)]
    for row in stored["rows"]:
        assert sum(row["answers"].values()) == round(row["turns"] * 3)  # every model turn counted once
        assert row["answers"]["no answer"] == round(row["format_error_rate"] * row["turns"] * 3)
    assert stored["provenance"]["seeds"] == [0, 1, 2]
    assert 0 < stored["random_mover"]["success"] < 0.2 and stored["random_mover"]["episodes"] == 256
    text = (tmp_path / "REPORT.md").read_text()
    assert "## What the model answers before training (`python -m experiments.answers RECIPE`" in text
    assert (
        "| format line | temperature | success | format errors | Left | Down | Right | Up | other | no answer |"
        in text
    )
    assert f"| `{lines[1]}` | 1.0 | 0.000 | 1.000 | 0.000 | 0.000 | 0.000 | 0.000 | 0.000 | 1.000 |" in text
    assert (
        f"uniformly random actions with the same budget reaches the goal in {stored['random_mover']['success']:.3f} of 256"
        in text
    )


def test_random_mover_success_by_hand():
    """experiments.answers.random_mover_success on a corridor worked out by hand: the goal is one Right from the
    start and Left at the wall stays put, so uniformly random moves reach it within n moves with probability
    1 - 0.5**n (0.5, 0.75, 0.875 for 1, 2, 3 moves: turns x actions per turn); the estimate over 4,000 start
    states is within 0.03 of it. A budget of 0 moves never succeeds; the episode's cap (``max_actions_per_episode``)
    binds below turns x actions per turn (3 x 2 moves capped at 1: 0.5)."""
    from experiments.answers import random_mover_success

    class Corridor:
        action_names = ["Left", "Right"]

        def reset(self, seed=None):
            self.at = 0

        def step(self, action):
            self.at = min(1, max(0, self.at + (1 if action == "Right" else -1)))
            done = self.at == 1
            return "", float(done), done, False, {"success": done}

        def close(self):
            pass

    for turns, per_turn, expected in [(1, 1, 0.5), (2, 1, 0.75), (1, 3, 0.875), (3, 1, 0.875)]:
        assert abs(random_mover_success(Corridor, range(4000), turns, per_turn) - expected) < 0.03
    assert random_mover_success(Corridor, range(10), 0, 1) == 0.0
    for turns, per_turn, cap, expected in [(3, 2, 1, 0.5), (3, 2, 2, 0.75), (1, 1, 5, 0.5)]:
        assert abs(random_mover_success(Corridor, range(4000), turns, per_turn, cap) - expected) < 0.03


def test_a_runs_flags_name_its_figure_and_long_flags_are_cut_with_their_hash():
    """experiments.real_model.flags_slug: short flags as they were (letters and digits, '-' between); a long
    format line is cut at 60 characters and ends with 8 hex digits of the flags' SHA-1 (two lines that share
    their first 60 characters get different names), so the figure's file name stays short."""
    import hashlib

    from experiments.real_model import flags_slug

    assert flags_slug(["--enable_think", "false"]) == "enable-think-false"
    a = [
        "--format_instruction",
        "Reply with only your next move: <answer>{actions[0]}</answer> or more",
        "--seed",
        "1",
    ]
    b = [*a[:3], "2"]
    # the first 60 characters end in "--", which is cut, then "-" and the hash
    digest = hashlib.sha1(" ".join(a).encode()).hexdigest()[:8]
    assert flags_slug(a) == "format-instruction-Reply-with-only-your-next-move---answer-" + digest
    assert flags_slug(b) != flags_slug(a) and flags_slug(b).startswith("format-instruction-Reply-with-only")


def test_warm_starts_are_evaluated_as_the_comparisons_evaluate_and_tabled(tmp_path, monkeypatch, tiny_tokenizer):
    """learning.py warm: each env's cached warm start (here an untrained tiny model saved as one: it writes no
    answer) plays the recipe's held-out episodes through the trainer's own evaluation; stored per env with when and
    where, kept for envs not measured again, and tabled. Beside it, on the same 256 held-out bandits: a random
    mover picks the better arm half the time (0.5), the teacher (the recipe's expert, replaced by a uniformly random
    arm with probability warm_start_noise 0.6) 1 - 0.6 / 2 = 0.7; each within 0.1 (over 3 standard errors)."""
    import json

    from experiments import learning, report
    from starpo_trl.tiny import build_tiny_model

    warm = tmp_path / "warm"
    build_tiny_model(tiny_tokenizer).save_pretrained(warm)
    tiny_tokenizer.save_pretrained(warm)
    monkeypatch.setattr(learning, "warm_started", lambda recipe, warm_dir: warm)
    monkeypatch.setattr(learning, "OUT", tmp_path / "runs")
    monkeypatch.setattr(learning, "ENVS", ("starpo/Bandit-v0",), raising=False)
    monkeypatch.setattr(learning, "RECIPES", {"starpo/Bandit-v0": ("demo-cpu-bandit.yaml", 10)})
    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "REPORT.md")
    monkeypatch.setattr(report, "README", tmp_path / "README.md")
    (tmp_path / "README.md").write_text("readme\n")
    earlier = {"success": 0.25, "format_error_rate": 0.5, "episodes": 256, "env_measured_at": "then", "commit": "abc"}
    report.store("warm_starts", {"per_env": {"starpo/Sokoban-v0": earlier}}, seeds=[0])
    learning.warm_starts()
    stored = json.loads((tmp_path / "results.json").read_text())["warm_starts"]["per_env"]
    assert stored["starpo/Sokoban-v0"] == earlier  # not measured again: kept
    bandit = stored["starpo/Bandit-v0"]
    assert (bandit["success"], bandit["format_error_rate"], bandit["episodes"]) == (0.0, 1.0, 256)
    assert abs(bandit["random_mover"] - 0.5) < 0.1 and abs(bandit["teacher"] - 0.7) < 0.1
    text = (tmp_path / "REPORT.md").read_text()
    assert "## Learning: the warm starts (`python -m experiments.learning warm`" in text
    refs = f"{bandit['random_mover']:.3f} | {bandit['teacher']:.3f}"
    assert f"| `starpo/Bandit-v0` | 0.000 | {refs} | 1.000 | 256 |" in text
    assert "| `starpo/Sokoban-v0` | 0.250 | - | - | 0.500 | 256 |" in text  # stored before the references
