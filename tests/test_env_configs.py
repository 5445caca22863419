"""Several envs in one run (env_configs / eval_env_configs): parsing, the split of a step's groups,
per-env metrics, and one held-out block per eval env."""

import pathlib

import pytest
from helpers import make_args

from starpo_trl import MultiTurnStarPOTrainer
from starpo_trl.env_configs import EnvConfig, group_envs, parse_env_configs, split_groups

BANDIT = {"env_id": "starpo/Bandit-v0"}
LAKE = {"env_id": "starpo/FrozenLake-v0", "env_kwargs": {"is_slippery": False}}


def test_parse_and_split():
    configs = parse_env_configs(
        '[{"env_id": "starpo/Bandit-v0", "n_groups": 1}, {"env_id": "starpo/FrozenLake-v0", "n_groups": 3}]',
        "env_configs",
    )
    assert [(c.name, c.n_groups) for c in configs] == [("Bandit-v0", 1), ("FrozenLake-v0", 3)]
    assert [c.name for c in group_envs(configs, 4)] == ["Bandit-v0", "FrozenLake-v0", "FrozenLake-v0", "FrozenLake-v0"]
    even = [EnvConfig("a"), EnvConfig("b")]
    assert split_groups(even, 4) == [2, 2]
    with pytest.raises(ValueError, match="does not split evenly"):
        split_groups(even, 3)
    with pytest.raises(ValueError, match="add up to 4 but num_start_states=6"):
        split_groups(configs, 6)
    with pytest.raises(ValueError, match="distinct 'name'"):
        parse_env_configs([BANDIT, BANDIT], "env_configs")
    with pytest.raises(ValueError, match="unknown keys"):
        parse_env_configs([{**BANDIT, "groups": 2}], "env_configs")
    with pytest.raises(ValueError, match="n_groups must be a whole number"):
        parse_env_configs([{**BANDIT, "n_groups": 0}], "env_configs")


def test_config_checks_env_configs(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        make_args(tmp_path, env_configs=[BANDIT])
    with pytest.raises(ValueError, match="Set n_groups on every entry"):
        make_args(tmp_path, env_id=None, env_configs=[{**BANDIT, "n_groups": 1}, LAKE])
    with pytest.raises(ValueError, match="Known starpo envs"):
        make_args(tmp_path, env_id=None, env_configs=[BANDIT, {"env_id": "starpo/Nope-v0"}])
    args = make_args(tmp_path, env_id=None, env_configs=[BANDIT, LAKE])
    assert args.env_id == "starpo/Bandit-v0"  # the first env: what the collapse guard watches
    assert [c.name for c in args.eval_envs()] == ["Bandit-v0", "FrozenLake-v0"]  # default: every training env
    # the quota: top half of each env's 2 groups is 1 group each -> 2 groups x 4 rows, as the layout check expects
    assert args.fixed_kept_groups() == 2
    one_eval = make_args(tmp_path, env_id=None, env_configs=[BANDIT, LAKE], eval_env_id="starpo/BanditTest-v0")
    assert [c.env_id for c in one_eval.eval_envs()] == ["starpo/BanditTest-v0"]


def test_one_run_trains_on_two_envs_and_evaluates_each(tmp_path, tiny_tokenizer, fresh_model):
    args = make_args(
        tmp_path,
        env_id=None,
        env_configs=[{**BANDIT, "n_groups": 2}, {**LAKE, "n_groups": 2}],
        eval_env_configs=[{"env_id": "starpo/BanditTest-v0"}, {**LAKE, "name": "Lake"}],
        max_turns=2,
        max_steps=1,
        num_eval_episodes=4,
        eval_temperature=0.0,  # greedy: evaluate.py below must reproduce the numbers
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    played = []
    play = trainer.play
    trainer.play = lambda starts, temperature: played.append(starts) or play(starts, temperature)
    trainer.train()
    # groups 0, 1 on Bandit and 2, 3 on FrozenLake (4 copies of each start state, seeds from TRL's sampler)
    envs = [s.env_id for s in played[0]]
    assert envs == ["starpo/Bandit-v0"] * 8 + ["starpo/FrozenLake-v0"] * 8
    assert all(dict(s.env_kwargs) == {"is_slippery": False} for s in played[0][8:])
    logged = {k for row in trainer.state.log_history for k in row}
    assert {"env/Bandit-v0/success", "env/FrozenLake-v0/success", "env/FrozenLake-v0/frac_zero_std_groups"} <= logged
    metrics = trainer.evaluate_success(name="after RL")
    assert [s.env_id for s in played[1]] == ["starpo/BanditTest-v0"] * 4 and [s.env_id for s in played[2]] == [
        "starpo/FrozenLake-v0"
    ] * 4
    assert {"success", "BanditTest-v0/success", "Lake/success", "Lake/turns"} <= set(metrics)
    lake = [ep for ep in trainer.last_eval_episodes if ep.start.env_id == "starpo/FrozenLake-v0"]
    assert metrics["Lake/success"] == sum(ep.success for ep in lake) / 4
    assert metrics["success"] == sum(ep.success for ep in trainer.last_eval_episodes) / 8
    # evaluate.py on the saved model plays the same held-out envs (from starpo_rollout.json): same numbers
    import json
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import evaluate

    trainer.save_model(str(tmp_path / "model"))
    tiny_tokenizer.save_pretrained(str(tmp_path / "model"))
    assert (
        evaluate.main(["--model_name_or_path", str(tmp_path / "model"), "--output", str(tmp_path / "eval.json")]) == 0
    )
    per_env = json.loads((tmp_path / "eval.json").read_text())["per_env"]
    assert sorted(per_env) == ["BanditTest-v0", "Lake"]
    for name in per_env:
        assert per_env[name]["episodes"] == 4 and per_env[name]["success"] == metrics[f"{name}/success"]
        assert per_env[name]["turns"] == metrics[f"{name}/turns"]


def test_warm_start_splits_its_demonstrations_between_the_envs(tmp_path, tiny_tokenizer, fresh_model, monkeypatch):
    import starpo_trl.warm_start as ws
    from starpo_trl.config import RunArguments

    seen = {}
    monkeypatch.setattr(ws, "warm_start", lambda model, tok, demos, *a, **k: seen.setdefault("demos", demos) and model)
    args = make_args(tmp_path, env_id=None, env_configs=[{**BANDIT, "n_groups": 1}, {**LAKE, "n_groups": 3}])
    ws.warm_start_from_config(fresh_model, tiny_tokenizer, RunArguments(warm_start_episodes=10), args)
    firsts = [row["messages"][1]["content"] for row in seen["demos"]]  # the first user message (after the system)
    lake = sum("lake" in text.lower() or "frozen" in text.lower() for text in firsts)
    assert len(firsts) == 10 and lake == 7  # 10 * 3 // 4 = 7 on FrozenLake, the rest (3) on Bandit
