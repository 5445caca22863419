"""Several envs in one run (env_configs / eval_env_configs): parsing, the split of a step's groups,
per-env metrics, and one held-out block per eval env."""

import json

import pytest
from helpers import make_args

from starpo_trl import MultiTurnStarPOTrainer
from starpo_trl.env_configs import (
    EnvConfig,
    group_envs,
    held_out_calls,
    metrics_name,
    parse_env_configs,
    process_starts,
    split_groups,
)
from starpo_trl.rollout import StartState

BANDIT = {"env_id": "starpo/Bandit-v0"}
LAKE = {"env_id": "starpo/FrozenLake-v0", "env_kwargs": {"is_slippery": False}}


def test_start_states_of_a_process_and_of_held_out_calls():
    a, b = EnvConfig("x/A-v0", {"k": 1}, name="A"), EnvConfig("x/B-v0", name="B")
    # a step of 4 groups of 2 (envs A, A, B, B) on 2 processes: process 1 holds groups 3 and 4 (both B)
    envs = [a, a, b, b]
    assert process_starts(envs, [5, 5, 6, 6], 2, 1) == [StartState("x/B-v0", s, ()) for s in (5, 5, 6, 6)]
    assert process_starts(envs, [1, 1, 2, 2], 2, 0) == [StartState("x/A-v0", s, (("k", 1),)) for s in (1, 1, 2, 2)]
    # 7 held-out seeds on 2 processes, 2 per call: process 0 plays 10, 12, 14, 16; process 1 11, 13, 15
    # and one empty call, so both make ceil(4 / 2) = 2 calls
    calls = [held_out_calls(b, range(10, 17), rank, 2, 2) for rank in (0, 1)]
    assert [[s.seed for s in call] for call in calls[0]] == [[10, 12], [14, 16]]
    assert [[s.seed for s in call] for call in calls[1]] == [[11, 13], [15]]
    assert metrics_name([a, b], StartState("x/A-v0", 0, (("k", 1),))) == "A"
    assert metrics_name([a, b], StartState("x/A-v0", 0, ())) == "A-v0"  # no config with these kwargs


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


def test_malformed_entries_are_refused_saying_what_to_change(tmp_path):
    """Each of these gave a TypeError deep inside, or was accepted (#45, item 9)."""
    cases = [
        ([{**BANDIT, "env_kwargs": [1, 2]}], "env_configs", r"env_configs\[0\].env_kwargs must be a dict"),
        ([{**BANDIT, "env_kwargs": "[1, 2]"}], "env_configs", r"env_configs\[0\].env_kwargs must be a dict"),
        ([{**BANDIT, "env_kwargs": "{oops"}], "env_configs", r"env_configs\[0\].env_kwargs is not a JSON object"),
        ([{"env_id": 7}], "env_configs", r"must be a dict with an env_id \(text\)"),
        ([{**BANDIT, "n_groups": True}], "env_configs", "n_groups must be a whole number"),
        ([{**BANDIT, "n_groups": 2}], "eval_env_configs", r"eval_env_configs\[0\] sets n_groups"),
        ([{**BANDIT, "name": 3}], "eval_env_configs", r"eval_env_configs\[0\].name=3: give a non-empty text"),
        ([{**BANDIT, "name": "a/b"}], "eval_env_configs", r"name='a/b': give a non-empty text without '/'"),
        ([{**BANDIT, "name": ""}], "env_configs", "give a non-empty text"),
    ]
    for value, setting, message in cases:
        with pytest.raises(ValueError, match=message):
            parse_env_configs(value, setting)
    with pytest.raises(ValueError, match="env_kwargs must be a dict"):
        make_args(tmp_path, env_id=None, env_configs=[{**BANDIT, "env_kwargs": [1, 2]}])
    with pytest.raises(ValueError, match="sets n_groups"):
        make_args(tmp_path, eval_env_configs=[{**BANDIT, "n_groups": 2}])
    # n_groups None (as a saved config writes it) is not a setting
    assert parse_env_configs([{**BANDIT, "n_groups": None}], "eval_env_configs")[0].n_groups is None


def test_top_k_abs_above_the_groups_it_ranks_is_refused(tmp_path):
    with pytest.raises(ValueError, match="keeps that many groups, but the filter ranks 4 at most"):
        make_args(tmp_path, rollout_filter_strategy="top_k_abs", rollout_filter_ratio=5, loss_type="dapo")
    assert make_args(tmp_path, rollout_filter_strategy="top_k_abs", rollout_filter_ratio=4).fixed_kept_groups() == 4
    per_env = dict(env_id=None, env_configs=[{**BANDIT, "n_groups": 1}, {**LAKE, "n_groups": 3}])
    with pytest.raises(ValueError, match=r"ranks 3 at most \(per env: \[1, 3\]\)"):
        make_args(tmp_path, rollout_filter_strategy="top_k_abs", rollout_filter_ratio=4, loss_type="dapo", **per_env)
    kept = make_args(
        tmp_path, rollout_filter_strategy="top_k_abs", rollout_filter_ratio=2, loss_type="dapo", **per_env
    )
    assert kept.fixed_kept_groups() == 3  # 1 of Bandit's 1, 2 of FrozenLake's 3


def test_config_checks_env_configs(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        make_args(tmp_path, env_configs=[BANDIT])
    with pytest.raises(ValueError, match="Set n_groups on every entry"):
        make_args(tmp_path, env_id=None, env_configs=[{**BANDIT, "n_groups": 1}, LAKE])
    with pytest.raises(ValueError, match="Known starpo envs"):
        make_args(tmp_path, env_id=None, env_configs=[BANDIT, {"env_id": "starpo/Nope-v0"}])
    args = make_args(tmp_path, env_id=None, env_configs=[BANDIT, LAKE])
    assert args.env_id == "starpo/Bandit-v0"  # the first env (the guard watches every env: test_guard.py)
    assert [c.name for c in args.eval_envs()] == ["Bandit-v0", "FrozenLake-v0"]  # default: every training env
    # the quota: top half of each env's 2 groups is 1 group each -> 2 groups x 4 rows, as the layout check expects
    assert args.fixed_kept_groups() == 2
    one_eval = make_args(tmp_path, env_id=None, env_configs=[BANDIT, LAKE], eval_env_id="starpo/BanditTest-v0")
    assert [c.env_id for c in one_eval.eval_envs()] == ["starpo/BanditTest-v0"]


def test_eval_env_takes_the_training_kwargs_only_when_it_is_the_training_env(tmp_path):
    pairs = {"arm_names": [["Lion", "Eagle"], ["Wolf", "Owl"]]}
    assert make_args(tmp_path, env_kwargs=pairs).eval_env_kwargs == pairs  # no eval env: the training env
    assert make_args(tmp_path, env_kwargs=pairs, eval_env_id="starpo/Bandit-v0").eval_env_kwargs == pairs
    # a held-out variant must not be played with the training names
    held_out = make_args(tmp_path, env_kwargs=pairs, eval_env_id="starpo/BanditTest-v0")
    assert held_out.eval_env_kwargs == {} and held_out.eval_envs()[0].env_kwargs == {}
    given = make_args(tmp_path, env_kwargs=pairs, eval_env_id="starpo/BanditTest-v0", eval_env_kwargs={"max_steps": 3})
    assert given.eval_env_kwargs == {"max_steps": 3}


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], ("starpo/BanditTest-v0", {"max_steps": 4})),  # the model's eval env, its saved kwargs
        (["--env_id", "starpo/Bandit-v0"], ("starpo/Bandit-v0", {"arm_names": [["Lion", "Eagle"]]})),  # training env
        (["--env_id", "starpo/FrozenLake-v0"], ("starpo/FrozenLake-v0", {})),  # another env: none of them
        (["--env_id", "starpo/FrozenLake-v0", "--env_kwargs", '{"size": 3}'], ("starpo/FrozenLake-v0", {"size": 3})),
    ],
)
def test_evaluate_gives_another_env_none_of_the_saved_kwargs(tmp_path, flags, expected):
    import evaluate  # the repository root is on sys.path (conftest.py)

    saved = {
        "env_id": "starpo/Bandit-v0",
        "env_kwargs": {"arm_names": [["Lion", "Eagle"]]},
        "eval_env_id": "starpo/BanditTest-v0",
        "eval_env_kwargs": {"max_steps": 4},
    }
    (tmp_path / "starpo_rollout.json").write_text(json.dumps(saved))
    settings = evaluate.resolve(evaluate.parser().parse_args(["--model_name_or_path", str(tmp_path), *flags]))
    env_id, kwargs, _ = settings.eval_envs[0]
    assert (env_id, kwargs) == expected


def test_evaluate_without_saved_eval_kwargs_follows_the_config_rule(tmp_path):
    import evaluate  # the repository root is on sys.path (conftest.py)

    pairs = {"arm_names": [["Lion", "Eagle"]]}
    for eval_env_id, expected in (("starpo/Bandit-v0", pairs), ("starpo/BanditTest-v0", {})):
        saved = {"env_id": "starpo/Bandit-v0", "env_kwargs": pairs, "eval_env_id": eval_env_id}
        (tmp_path / "starpo_rollout.json").write_text(json.dumps(saved))
        settings = evaluate.resolve(evaluate.parser().parse_args(["--model_name_or_path", str(tmp_path)]))
        assert settings.eval_envs[0][:2] == (eval_env_id, expected)
        config = make_args(tmp_path, env_kwargs=pairs, eval_env_id=eval_env_id)
        assert config.eval_env_kwargs == expected  # one rule for the trainer and evaluate.py


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
    import evaluate  # the repository root is on sys.path (conftest.py)

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
