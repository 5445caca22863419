"""The command lines: checks before any model loads, evaluate.py reproducing training's evaluation,
envs from the user's own modules, and the CPU install of torch."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
USER_ENVS = str(pathlib.Path(__file__).resolve().parent / "user_envs")


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([USER_ENVS, str(ROOT)])}


def _main(tmp_path, *extra):
    """train.py's entry point on these arguments (in process: every failure here comes before a model loads)."""
    sys.path.insert(0, str(ROOT))
    import train

    argv = [
        "--model_name_or_path",
        "tiny",
        "--env_id",
        "starpo/Bandit-v0",
        "--output_dir",
        str(tmp_path / "out"),
        "--report_to",
        "none",
        *extra,
    ]
    return train.cli(argv)


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--advantage_estimator", "gae", "--critic_init", str(pathlib.Path("runs") / "typo" / "critic")],
            "no such model directory",
        ),
        (["--advantage_estimator", "gae", "--critic_init", "./typo"], "no such model directory"),
        (["--resume_from_checkpoint", "/no/such/checkpoint-3"], "not a checkpoint folder"),
        (["--resume_from_checkpoint", "true"], "holds no checkpoint"),
        (
            ["--env_kwargs", '{"mirror_seeds": true}', "--num_start_states", "3", "--num_generations", "4"],
            "set shuffle_dataset: false .*; an even num_start_states \\(got 3\\)",
        ),
        (
            ["--env_kwargs", '{"mirror_seeds": true}', "--shuffle_dataset", "false", "--num_start_states", "4"]
            + ["--train_seed_offset", "1"],
            "consecutive seeds in whole pairs; set an even train_seed_offset \\(got 1\\)\\.$",
        ),
    ],
)
def test_train_refuses_bad_paths_and_settings_before_any_model_loads(tmp_path, extra, message, monkeypatch):
    # train imported before the patch: imported for the first time while starpo_trl.models is patched, it would bind the stand-in as
    # its own name, and undoing the patch would leave it there for every later test of this process
    import starpo_trl.models
    import train

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(starpo_trl.models, "load_model_and_tokenizer", no_load)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    monkeypatch.setattr(train, "load_model_and_tokenizer", no_load)
    with pytest.raises(ValueError, match=message):
        _main(tmp_path, *extra)
    assert not (tmp_path / "out").exists()  # a failed run leaves no output directory behind


def test_train_refuses_a_report_path_of_another_shape(tmp_path, monkeypatch):
    import train

    monkeypatch.setattr(
        train, "load_model_and_tokenizer", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded"))
    )
    other = tmp_path / "other.json"
    other.write_text(json.dumps([1, 2, 3]))
    with pytest.raises(ValueError, match="not a report of this script"):
        _main(tmp_path, "--report_path", str(other))
    other.write_text("{not json")
    with pytest.raises(ValueError, match="not a report of this script"):
        _main(tmp_path, "--report_path", str(other))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num_episodes", "0"], "at least 1"),
        (["--env_kwargs", '{"is_slippery": "false"}'], "expected bool"),
        (["--env_kwargs", "[1, 2]"], "JSON object"),
        (["--env_kwargs", '{"no_such": 1}'], "takes no argument"),
        (["--output", "/no/such/dir/eval.json"], "cannot be written"),
        (["--save_episodes", "/no/such/dir/episodes.jsonl"], "--save_episodes '/no/such/dir/episodes.jsonl' cannot"),
        (["--temperature", "-1"], ">= 0"),
        (["--format_instruction", "Say {what}"], "may name only {example_action}"),
        (["--env_id", "starpo/Countdown-v0", "--format_instruction", "{example_action}"], "no named actions"),
    ],
)
def test_evaluate_refuses_bad_arguments_before_loading(tmp_path, args, message, capsys):
    sys.path.insert(0, str(ROOT))
    import evaluate

    code = evaluate.main(
        ["--model_name_or_path", str(tmp_path / "no-model"), "--env_id", "starpo/FrozenLake-v0", *args]
    )
    assert code == 2 and message in capsys.readouterr().err


def test_evaluate_opens_replies_and_words_the_format_as_the_model_was_trained(tmp_path):
    """``reply_prefix``, ``format_instruction`` and ``stop_strings`` come from the model's starpo_rollout.json;
    flags override."""
    sys.path.insert(0, str(ROOT))
    import json

    import evaluate

    saved = {
        "env_id": "starpo/Bandit-v0",
        "reply_prefix": "auto",
        "format_instruction": "e.g. {example_action}",
        "stop_strings": ["</answer>"],
    }
    (tmp_path / "starpo_rollout.json").write_text(json.dumps(saved))
    settings = evaluate.resolve(evaluate.parser().parse_args(["--model_name_or_path", str(tmp_path)]))
    assert settings.reply_prefix == "auto" and settings.format_instruction == "e.g. {example_action}"
    assert settings.stop_strings == ["</answer>"]
    flags = ["--model_name_or_path", str(tmp_path), "--reply_prefix", "", "--format_instruction", "Pick one."]
    settings = evaluate.resolve(evaluate.parser().parse_args([*flags, "--stop_strings"]))
    assert settings.reply_prefix == "" and settings.format_instruction == "Pick one." and settings.stop_strings == []


def test_user_env_trains_and_evaluate_reproduces_the_training_evaluation(tmp_path):
    """A custom env from the user's own module (``module:EnvName-v0``) through train.py, then
    evaluate.py with nothing but the model directory: same env, seeds and settings, same result."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "--model_name_or_path",
        "tiny",
        "--tiny_hidden_size",
        "32",
        "--tiny_num_layers",
        "1",
        "--env_id",
        "coin_guess:CoinGuess-v0",
        "--env_kwargs",
        '{"bias": 0.7}',
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
        "--num_start_states",
        "2",
        "--num_generations",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "1",
        "--rollout_filter_ratio",
        "1.0",
        "--num_eval_episodes",
        "6",
        "--eval_temperature",
        "0",
        "--max_turns",
        "1",
        "--max_tokens_per_turn",
        "12",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--use_cpu",
        "true",
        "--save_strategy",
        "no",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tmp_path, env=_env())
    report = json.loads((out / "report.json").read_text())
    assert report["env_id"] == "coin_guess:CoinGuess-v0"
    assert any("env/CoinGuess-v0/success" in row for row in report["log_history"])
    card = (out / "README.md").read_text()
    assert "python evaluate.py --model_name_or_path MODEL`" in card
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "evaluate.py"),
            "--model_name_or_path",
            str(out),
            "--output",
            str(tmp_path / "eval.json"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
    )
    assert res.returncode == 0, res.stderr
    evaluation = json.loads((tmp_path / "eval.json").read_text())
    assert evaluation["model"] == str(out) and evaluation["env_id"] == "coin_guess:CoinGuess-v0"
    assert evaluation["env_kwargs"] == {"bias": 0.7} and evaluation["episodes"] == 6 and evaluation["temperature"] == 0
    assert evaluation["settings"]["max_turns"] == 1 and evaluation["settings"]["max_tokens_per_turn"] == 12
    for key in ("success", "reward_mean", "turns", "format_error_rate"):  # greedy: the very same episodes
        assert evaluation[key] == pytest.approx(report["after"][key]), key


def test_evaluate_exits_non_zero_when_envs_fail(tmp_path):
    from starpo_trl.tiny import save_tiny

    path = save_tiny(str(tmp_path / "model"), hidden_size=32, num_layers=1)
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "evaluate.py"),
            "--model_name_or_path",
            path,
            "--env_id",
            "failing_env:AlwaysFails-v0",
            "--num_episodes",
            "3",
            "--max_tokens_per_turn",
            "4",
            "--output",
            str(tmp_path / "eval.json"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
    )
    assert res.returncode == 1 and "the env failed in 3 of 3 episodes" in res.stderr
    assert json.loads((tmp_path / "eval.json").read_text())["env_errors"] == 3


def test_evaluate_saves_every_episode_as_json_lines(tmp_path, capsys):
    """--save_episodes: one line per episode, consistent with the printed metrics, with the conversation."""
    import evaluate
    from starpo_trl.tiny import save_tiny

    path = save_tiny(str(tmp_path / "model"), hidden_size=32, num_layers=1)
    lines_file, metrics_file = tmp_path / "episodes.jsonl", tmp_path / "eval.json"
    code = evaluate.main(
        ["--model_name_or_path", path, "--env_id", "starpo/Bandit-v0", "--num_episodes", "3", "--seed_offset", "50"]
        + ["--max_turns", "2", "--max_tokens_per_turn", "6", "--batch_size", "2"]
        + ["--output", str(metrics_file), "--save_episodes", str(lines_file)]
    )
    assert code == 0
    rows = [json.loads(line) for line in lines_file.read_text().splitlines()]
    metrics = json.loads(metrics_file.read_text())
    assert [r["seed"] for r in rows] == [50, 51, 52]  # two engine calls (batch_size 2), in seed order
    assert {r["env"] for r in rows} == {"Bandit-v0"} and {r["env_id"] for r in rows} == {"starpo/Bandit-v0"}
    assert sum(r["success"] for r in rows) / 3 == pytest.approx(metrics["success"])
    assert sum(r["turns"] for r in rows) / 3 == pytest.approx(metrics["turns"])
    assert sum(r["reward"] for r in rows) / 3 == pytest.approx(metrics["reward_mean"])
    for r in rows:
        roles = [m["role"] for m in r["messages"]]
        assert roles.count("assistant") == r["turns"] and r["env_error"] is None
        assert "two-armed bandit" in next(m["content"] for m in r["messages"] if m["role"] == "user")


@pytest.mark.parametrize(
    "index_url, local, expected",
    [
        (
            "https://mirror.example/whl/cpu",
            True,
            ["install -q torch==2.13.0 --index-url https://mirror.example/whl/cpu"],
        ),
        (
            "",
            True,
            [
                "download -q --no-index --no-deps torch==2.13.0 -d TMP",
                "install -q TMP/torch-2.13.0+cpu-cp311-none-any.whl",
            ],
        ),
        (
            "",
            False,
            [
                "download -q --no-index --no-deps torch==2.13.0 -d TMP",
                "install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
            ],
        ),
    ],
)
def test_torch_install_takes_the_cpu_build(tmp_path, index_url, local, expected):
    """A local CPU wheel of torch that pip is configured to find is installed as it is (its
    dependencies from the usual indexes); otherwise PyTorch's CPU index, never PyPI's default CUDA
    build; TORCH_INDEX_URL overrides both."""
    import re

    log = tmp_path / "pip.log"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\nshift 2\n"  # "-m pip"
        f'echo "$*" >> {log}\n'
        'if [ "$1" = download ]; then\n'
        f"  {'exit 1' if not local else ''}\n"
        '  for a in "$@"; do last="$a"; done; touch "$last/torch-2.13.0+cpu-cp311-none-any.whl"\n'
        "fi\nexit 0\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PY": str(fake), "TORCH_INDEX_URL": index_url, "TORCH_VERSION": "2.13.0"}
    subprocess.run(["sh", str(ROOT / "scripts" / "install_torch.sh")], check=True, env=env, capture_output=True)
    calls = [re.sub(r"/\S*tmp\.\w+", "TMP", line) for line in log.read_text().split("\n")[:-1]]
    assert calls == expected


def test_the_script_ends_the_process_group_after_a_finished_run_only(tmp_path, monkeypatch):
    """train.py's entry point destroys the process group once main returned and every rank got there (a barrier
    first: gloo torn down while another rank still talks to it, or left alive at exit, can abort a rank), and leaves
    it to the launcher when main raised (a failed rank must not wait on the others)."""
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    import train

    argv = ["--model_name_or_path", "tiny", "--env_id", "starpo/Bandit-v0", "--output_dir", str(tmp_path / "out")]
    store = str(tmp_path / "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        seen, barrier = [], dist.barrier
        monkeypatch.setattr(train, "main", lambda *a: seen.append(dist.is_initialized()) or {"success_after": 1.0})
        monkeypatch.setattr(dist, "barrier", lambda *a, **k: seen.append("barrier") or barrier(*a, **k))
        assert train.cli(argv) == {"success_after": 1.0}
        assert seen == [True, "barrier"] and not dist.is_initialized()

        dist.init_process_group("gloo", init_method=f"file://{store}-2", rank=0, world_size=1)

        def fails(*a):
            raise RuntimeError("a rank failed")

        monkeypatch.setattr(train, "main", fails)
        with pytest.raises(RuntimeError, match="a rank failed"):
            train.cli(argv)
        assert dist.is_initialized() and seen == [True, "barrier"]  # no barrier after a raise either
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_train_prints_one_clean_line_for_a_refused_setting_and_the_traceback_on_request(tmp_path, capsys, monkeypatch):
    """evaluate.py printed one line and train.py a full traceback for the same kind of error (#45, item 11)."""
    import train

    monkeypatch.setattr(
        train, "load_model_and_tokenizer", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded"))
    )
    argv = ["--model_name_or_path", "tiny", "--env_id", "starpo/Bandit-v0", "--output_dir", str(tmp_path / "out")]
    assert train.script([*argv, "--max_turns", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: max_turns must be at least 1") and "Traceback" not in err and err.count("\n") == 1
    assert train.script([*argv, "--critic_init", "./typo", "--advantage_estimator", "gae"]) == 2  # a check in main()
    assert "no such model directory" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_turns must be at least 1"):
        train.script([*argv, "--max_turns", "0", "--traceback"])


def test_evaluate_takes_trainings_names_and_shows_the_traceback_on_request(tmp_path, capsys):
    sys.path.insert(0, str(ROOT))
    import evaluate

    base = ["--model_name_or_path", str(tmp_path / "no-model"), "--env_id", "starpo/FrozenLake-v0"]
    a = evaluate.parser().parse_args(
        [*base, "--num_eval_episodes", "7", "--eval_seed_offset", "5", "--eval_temperature", "0.2"]
    )
    assert (a.num_episodes, a.seed_offset, a.temperature) == (7, 5, 0.2)
    assert evaluate.main([*base, "--num_eval_episodes", "0"]) == 2
    assert "--num_episodes must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least 1"):
        evaluate.main([*base, "--num_eval_episodes", "0", "--traceback"])


def test_choosing_the_envs_on_the_command_line_replaces_the_recipes_choice(tmp_path):
    """A recipe with env_id could not be switched to env_configs from the command line (#45, item 11)."""
    import yaml

    import train

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "env_id": "starpo/Bandit-v0",
                "env_kwargs": {"expected_reward": True},
                "eval_env_id": "starpo/BanditTest-v0",
            }
        )
    )
    base = ["--config", str(recipe), "--output_dir", str(tmp_path / "out"), "--num_start_states", "4"]
    configs = '[{"env_id": "starpo/Bandit-v0"}, {"env_id": "starpo/FrozenLake-v0"}]'
    _, args, _, _ = train.parser().parse_args_and_config(args=[*base, "--env_configs", configs])
    assert [c.env_id for c in args.train_envs()] == ["starpo/Bandit-v0", "starpo/FrozenLake-v0"]
    assert args.env_kwargs == {}  # the recipe's kwargs went with its env_id
    held_out = '[{"env_id": "starpo/BanditTest-v0"}, {"env_id": "starpo/Bandit-v0"}]'
    _, args, _, _ = train.parser().parse_args_and_config(args=[*base, "--eval_env_configs", held_out])
    assert [c.env_id for c in args.eval_envs()] == ["starpo/BanditTest-v0", "starpo/Bandit-v0"]
    # and back: a recipe with env_configs, --env_id on the command line
    recipe.write_text(
        yaml.safe_dump({"env_configs": [{"env_id": "starpo/Bandit-v0"}, {"env_id": "starpo/FrozenLake-v0"}]})
    )
    _, args, _, _ = train.parser().parse_args_and_config(args=[*base, "--env_id", "starpo/Sokoban-v0"])
    assert args.env_configs is None and args.env_id == "starpo/Sokoban-v0"
    # with both on the command line nothing is dropped: the pair is refused as before
    with pytest.raises(ValueError, match="not both"):
        train.parser().parse_args_and_config(args=[*base, "--env_id", "starpo/Sokoban-v0", "--env_configs", configs])


def test_the_console_scripts_are_the_two_entry_points():
    """`starpo-train` and `starpo-eval` (pyproject's [project.scripts]) run train.py's script() and evaluate.py's main()."""
    from importlib.metadata import entry_points

    import evaluate
    import train

    scripts = {ep.name: ep for ep in entry_points(group="console_scripts") if ep.name.startswith("starpo-")}
    assert scripts["starpo-train"].load() is train.script and scripts["starpo-eval"].load() is evaluate.main


def test_train_sets_torch_threads_before_the_model_loads(tmp_path, monkeypatch):
    """--torch_threads: torch computes with that many threads from before the model loads; 0 is refused."""
    import torch

    import train

    seen = []

    def load(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise AssertionError("stop here")

    monkeypatch.setattr(train, "load_model_and_tokenizer", load)
    argv = ["--model_name_or_path", "tiny", "--env_id", "starpo/Bandit-v0", "--output_dir", str(tmp_path / "out")]
    before = torch.get_num_threads()
    try:
        with pytest.raises(AssertionError, match="stop here"):
            train.script([*argv, "--torch_threads", "1"])
    finally:
        torch.set_num_threads(before)
    assert seen == [1]
    assert train.script([*argv, "--torch_threads", "0"]) == 2
