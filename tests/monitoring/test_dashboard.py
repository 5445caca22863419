"""The dashboard CLI draws from a run directory, with guard events."""

import json
import os
import subprocess
import sys

import pytest

from starpo_trl.monitoring.diagnostics import load_run, main


def history(n=6):
    rows = []
    for step in range(1, n + 1):
        rows.append(
            {
                "step": step,
                "loss": 0.1,
                "grad_norm": 1.0 + step,
                "entropy": 2.0 - 0.2 * step,
                "env/FrozenLake-v0/success": 0.1 * step,
                "env/FrozenLake-v0/group_reward_std_mean": 0.5,
                "reasoning/distinct_2": 0.5,
                "reasoning/template_share": 0.3,
            }
        )
    if n >= 5:
        rows[4]["guard/warning"], rows[4]["guard/rules"] = 1.0, "entropy"
    return rows


def test_plot_from_report_json(tmp_path):
    with open(tmp_path / "report.json", "w") as f:
        json.dump({"env_id": "starpo/FrozenLake-v0", "log_history": history()}, f)
    with open(tmp_path / "guard_events.json", "w") as f:
        json.dump([{"step": 5, "rules": ["entropy"]}], f)
    out = main(["plot", str(tmp_path)])
    assert out == os.path.join(str(tmp_path), "dashboard.png")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    hist, events, env = load_run(str(tmp_path))
    assert env == "FrozenLake-v0" and events[0]["step"] == 5 and len(hist) == 6


def test_plot_from_newest_checkpoint_via_module_cli(tmp_path):
    for step in (2, 10):
        os.makedirs(tmp_path / f"checkpoint-{step}")
        with open(tmp_path / f"checkpoint-{step}" / "trainer_state.json", "w") as f:
            json.dump({"log_history": history(step)}, f)
    hist, events, env = load_run(str(tmp_path))
    assert len(hist) == 10 and events is None and env is None
    out = tmp_path / "d.png"
    subprocess.run(
        [sys.executable, "-m", "starpo_trl.monitoring.diagnostics", "plot", str(tmp_path), "--out", str(out)],
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert out.stat().st_size > 1000


def test_missing_run_dir_says_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="report.json"):
        load_run(str(tmp_path))


def test_the_mi_panel_appears_only_when_the_run_logged_the_mi_pass(tmp_path):
    from starpo_trl.monitoring.plotting import DASHBOARD_PANELS, dashboard_panels, plot_dashboard

    rows = history()
    assert dashboard_panels(rows) == DASHBOARD_PANELS
    rows[1].update(
        {"collapse/retrieval_accuracy": 0.5, "collapse/retrieval_chance": 0.25, "collapse/mi_estimate": 0.3}
    )
    panels = dashboard_panels(rows)
    assert [name for name, _, _ in panels] == [
        "success",
        "reward_std",
        "entropy",
        "grad_norm",
        "diversity",
        "retrieval",
    ]
    assert panels[-1][1] == ["collapse/retrieval_accuracy", "collapse/retrieval_chance", "collapse/mi_estimate"]
    with_mi, without = (
        plot_dashboard(rows, str(tmp_path / "mi.png")),
        plot_dashboard(history(), str(tmp_path / "no.png")),
    )
    from PIL import Image

    assert Image.open(with_mi).width > Image.open(without).width  # one more panel


def test_each_training_env_gets_its_own_line_labelled_by_name():
    """A multi-env run's per-env panels draw one line per env, labelled by its name; a panel of several keys
    labels each key (and the env too when there are several); keys never logged draw nothing."""
    from starpo_trl.monitoring.plotting import env_names_from_history, panel_lines

    rows = [
        {"step": 1, "entropy": 2.0, "env/Bandit-v0/success": 0.5, "env/lake/success": 0.1},
        {"step": 2, "entropy": 1.9, "env/Bandit-v0/success": 0.75, "env/lake/success": None},
        {"step": 3, "env/lake/success": 0.3, "env/lake/format_error_rate": 0.2},
    ]
    assert env_names_from_history(rows) == ["Bandit-v0", "lake"]
    two = ["Bandit-v0", "lake"]
    assert panel_lines(rows, ["env/{env}/success"], two) == [
        ("Bandit-v0", [1, 2], [0.5, 0.75]),
        ("lake", [1, 3], [0.1, 0.3]),
    ]
    assert panel_lines(rows, ["env/{env}/success"], ["lake"]) == [("success", [1, 3], [0.1, 0.3])]
    assert panel_lines(rows, ["entropy"], two) == [("entropy", [1, 2], [2.0, 1.9])]
    assert panel_lines(rows, ["env/{env}/success", "env/{env}/format_error_rate"], two) == [
        ("Bandit-v0 success", [1, 2], [0.5, 0.75]),
        ("lake success", [1, 3], [0.1, 0.3]),
        ("lake format_error_rate", [3], [0.2]),
    ]
    assert panel_lines(rows, ["reasoning/distinct_2"], two) == []


def test_the_dashboard_cli_plots_the_envs_training_logged_not_the_held_out_one(tmp_path, monkeypatch):
    """report.json's env_id is the held-out env (BanditTest-v0 for a Bandit run), whose key training never logs:
    the CLI draws the training envs the history holds."""
    import starpo_trl.monitoring.plotting as plotting

    seen = {}
    monkeypatch.setattr(plotting, "plot_dashboard", lambda history, path, envs, *a, **k: seen.setdefault("envs", envs))
    rows = [{"step": 1, "loss": 0.0, "env/Bandit-v0/success": 0.5, "env/FrozenLake-v0/success": 0.1}]
    with open(tmp_path / "report.json", "w") as f:
        json.dump({"env_id": "starpo/BanditTest-v0", "log_history": rows}, f)
    main(["plot", str(tmp_path)])
    assert seen["envs"] == ["Bandit-v0", "FrozenLake-v0"]
