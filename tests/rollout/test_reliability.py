"""Failing environments, long episodes, resume, bad configuration, safety."""

import pathlib
import re
import time

import gymnasium as gym
import helpers
import pytest
import torch

from envs.sokoban import SokobanEnv
from starpo_trl import MultiTurnStarPOTrainer, StarPOConfig
from starpo_trl.monitoring.empty_steps import TrainingStopped
from starpo_trl.rollout import HFBackend, RolloutConfig, RolloutEngine, StartState

ROOT = pathlib.Path(__file__).resolve().parents[2]


class FlakyEnv(SokobanEnv):
    """Sokoban whose seed decides how it misbehaves: seeds 101, 102, 103, 104 raise in reset, raise in
    step, sleep in step (3 s, three times the tests' 1 s timeout), pay NaN; other seeds (the config's
    pre-flight check uses 0 and 1) are fine. The timeout leaves a healthy env's call (a fork, gym.make,
    a step) a whole second, so a loaded machine does not time it out."""

    def reset(self, *, seed=None, options=None):
        self.mode = seed % 10 if seed is not None and seed > 100 else 0
        if self.mode == 1:
            raise RuntimeError("reset failed")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.mode == 2:
            raise RuntimeError("step failed")
        if self.mode == 3:
            time.sleep(3.0)
        obs, r, term, trunc, info = super().step(action)
        return obs, (float("nan") if self.mode == 4 else r), term, trunc, info


gym.register("starpo/TestFlaky-v0", entry_point=FlakyEnv, disable_env_checker=True, order_enforce=False)


class NaNEnv(SokobanEnv):
    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, float("inf"), term, trunc, info


gym.register("starpo/TestNaN-v0", entry_point=NaNEnv, disable_env_checker=True, order_enforce=False)


def test_failing_envs_end_only_their_own_episode(tiny_tokenizer, scripted):
    cfg = RolloutConfig(max_turns=3, env_step_timeout=1.0)
    engine = RolloutEngine(
        tiny_tokenizer, scripted("<think>x</think><answer>Up||Left</answer>"), cfg, [tiny_tokenizer.eos_token_id]
    )
    start = time.time()
    eps = engine.run([StartState("starpo/TestFlaky-v0", s) for s in (110, 101, 102, 103, 104, 120)])
    assert time.time() - start < 3 * 3.0  # the slow env's three 3 s steps did not all run
    errors = [ep.env_error for ep in eps]
    assert errors[0] is None and errors[5] is None and eps[0].num_turns >= 1
    assert "reset failed" in errors[1] and "step failed" in errors[2]
    assert "Timeout" in errors[3] and "non-finite reward" in errors[4]
    assert all(ep.done for ep in eps[1:5])


class HangingEnv(SokobanEnv):
    """Seed 1xx5 busy-loops forever in step, seed 1xx6 sleeps forever in reset; others are fine."""

    def reset(self, *, seed=None, options=None):
        self.mode = seed % 10 if seed is not None and seed > 100 else 0
        if self.mode == 6:
            time.sleep(10_000)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        while self.mode == 5:
            pass
        return super().step(action)


gym.register("starpo/TestHanging-v0", entry_point=HangingEnv, disable_env_checker=True, order_enforce=False)


def test_hung_envs_are_killed_concurrently_and_leave_nothing_behind(tiny_tokenizer, scripted):
    import multiprocessing
    import os
    import threading

    threads_before = {t.name for t in threading.enumerate()} | {"tqdm_monitor"}  # tqdm starts its monitor once
    children_before = {p.pid for p in multiprocessing.active_children()}
    timeout = 1.0  # a healthy call (fork, gym.make, reset, step) has a whole second even on a loaded machine
    cfg = RolloutConfig(max_turns=2, env_step_timeout=timeout)
    engine = RolloutEngine(
        tiny_tokenizer, scripted("<think>x</think><answer>Up</answer>"), cfg, [tiny_tokenizer.eos_token_id]
    )
    seeds = (105, 115, 125, 106, 116, 126, 110, 120)  # three busy loops, three hung resets, two fine envs
    start = time.perf_counter()
    eps = engine.run([StartState("starpo/TestHanging-v0", s) for s in seeds])
    wall = time.perf_counter() - start
    # the timeouts overlap (one reset wave, one step wave: about 2 s), instead of adding up to 6 x 1 s
    assert wall < 4.5 * timeout, wall
    assert [("Timeout" in (ep.env_error or "")) for ep in eps] == [True] * 6 + [False] * 2
    assert eps[6].num_turns == eps[7].num_turns == 2
    # env time is the time really spent waiting on envs, not the bookkeeping around them
    assert 2 * timeout <= eps.timings["env"] <= wall
    # nothing of a hung env is left running: its worker process is gone, no thread waits on it
    pids = [w.process.pid for w in engine.runner._idle]
    assert len(pids) == 2  # only the two healthy workers are kept for the next rollout
    assert {p.pid for p in multiprocessing.active_children()} - children_before == set(
        pids
    )  # the six others were killed
    time.sleep(0.2)
    assert {t.name for t in threading.enumerate()} <= threads_before  # no thread still waits on a hung env
    engine.close()
    for pid in pids:
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"worker {pid} still alive")
    # and the next rollout runs at full speed with fresh workers
    start = time.perf_counter()
    again = engine.run([StartState("starpo/TestHanging-v0", s) for s in (110, 120)])
    assert time.perf_counter() - start < 2 * timeout and all(ep.env_error is None for ep in again)
    engine.close()


def test_timeouts_need_worker_processes():
    with pytest.raises(ValueError, match="env_runner='processes'"):
        StarPOConfig(
            output_dir="/tmp/unused",
            env_id="starpo/Bandit-v0",
            env_step_timeout=1.0,
            env_runner="threads",
            report_to=[],
        )
    for bad in (float("nan"), float("inf"), 0.0):
        with pytest.raises(ValueError, match="env_step_timeout"):
            StarPOConfig(output_dir="/tmp/unused", env_id="starpo/Bandit-v0", env_step_timeout=bad, report_to=[])


# a flaky env's runs, each env call with a timeout (helpers.make_args is the one factory; these its changes)
FLAKY_RUN = dict(
    env_id="starpo/TestFlaky-v0",
    rollout_filter_ratio=1.0,
    max_turns=2,
    max_tokens_per_turn=10,
    disable_tqdm=True,
    env_step_timeout=1.0,
    num_eval_episodes=256,
)


def _args(tmp_path, **kw):
    return helpers.make_args(tmp_path, **{**FLAKY_RUN, **kw})


@pytest.fixture
def small_model(tiny_tokenizer):
    from starpo_trl.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer, seed=3, hidden_size=32, num_layers=1)


def test_training_continues_through_env_failures_and_counts_them(tmp_path, tiny_tokenizer, small_model, scripted):
    from datasets import Dataset

    starts = Dataset.from_dict({"seed": [102, 103, 110, 120]})  # every step: one raising, one slow env
    backend = scripted("<think>x</think><answer>Up||Left</answer>")  # well-formed replies, so the envs get stepped
    trainer = MultiTurnStarPOTrainer(
        small_model, _args(tmp_path), processing_class=tiny_tokenizer, train_dataset=starts, backend=backend
    )
    trainer.train()
    errors = [row["env/errors"] for row in trainer.state.log_history if "env/errors" in row]
    assert len(errors) == 2 and all(e == 8 for e in errors)  # 2 failing start states x 4 episodes, each step


@pytest.mark.parametrize("policy", ["exclude", "failure_reward"])
def test_failed_episodes_are_excluded_or_get_the_failure_reward(
    tmp_path, tiny_tokenizer, small_model, policy, scripted
):
    args = _args(tmp_path, env_error_policy=policy, env_failure_reward=-2.0)
    backend = scripted("<think>x</think><answer>Up||Left</answer>")
    trainer = MultiTurnStarPOTrainer(small_model, args, processing_class=tiny_tokenizer, backend=backend)
    seeds = [110, 102, 120, 130]  # group 1 fails (seed 102 raises in step)
    batch = trainer._generate_and_score_completions([{"seed": s} for s in seeds for _ in range(4)])
    failed_rows = torch.arange(4, 8)
    if policy == "exclude":
        assert batch["tool_mask"][failed_rows].sum() == 0
        assert torch.equal(batch["advantages"][failed_rows], torch.zeros(4))
    else:
        assert batch["tool_mask"][failed_rows].sum() > 0
        assert torch.allclose(
            batch["advantages"][failed_rows], torch.zeros(4), atol=1e-3
        )  # a group of equal -2.0 rewards


def test_episode_token_cap_keeps_logprobs_exact(tiny_tokenizer, tiny_model):
    torch.manual_seed(1)
    backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
    cfg = RolloutConfig(max_turns=5, max_tokens_per_turn=8, max_episode_tokens=120)
    ep = RolloutEngine(tiny_tokenizer, backend, cfg, [tiny_tokenizer.eos_token_id]).run(
        [StartState("starpo/Sokoban-v0", 4)]
    )[0]
    assert ep.truncated and ep.env_mask[-1] == 1 and len(ep.completion_ids) <= 120
    ids = torch.tensor([ep.prompt_ids + ep.completion_ids])
    with torch.no_grad():
        logps = torch.log_softmax(tiny_model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None]).squeeze(1)
    logps = logps[len(ep.prompt_ids) - 1 :]
    mask = torch.tensor(ep.env_mask, dtype=torch.bool)
    assert torch.allclose(logps[mask], torch.tensor(ep.logprobs)[mask], atol=1e-4)


def test_bad_configuration_fails_before_any_model_loads(tmp_path):
    with pytest.raises(ValueError, match="finite"):
        _args(tmp_path, env_id="starpo/TestNaN-v0")
    with pytest.raises(ValueError, match="takes no argument 'no_such_kwarg'"):
        _args(tmp_path, env_id="starpo/Sokoban-v0", env_kwargs={"no_such_kwarg": 1})
    with pytest.raises(ValueError, match="is_slippery='false' is a str, expected bool"):
        _args(tmp_path, env_id="starpo/FrozenLake-v0", env_kwargs='{"is_slippery": "false"}')
    with pytest.raises(ValueError, match="JSON object of keyword arguments"):
        _args(tmp_path, env_kwargs="[1, 2]")
    _args(
        tmp_path, env_id="starpo/FrozenLake-v0", env_kwargs={"is_slippery": False, "p": 1, "max_episode_steps": 9}
    )  # int for a float, make's own


@pytest.mark.parametrize(
    "field, value",
    [
        ("gamma", -1.0),
        ("lam", 2.0),
        ("turn_gamma", 1.5),
        ("turn_lambda", -0.1),
        ("critic_learning_rate", -1.0),
        ("value_clip", -0.5),
        ("num_eval_episodes", 0),
        ("eval_temperature", -0.5),
        ("temperature", 0.0),
        ("format_penalty", 0.5),
        ("env_step_timeout", float("nan")),
        ("critic_warmup_steps", -1),
        ("num_train_seeds", 0),
        ("max_steps", 0),
        ("max_empty_steps", 0),
        ("top_k", 20),
        ("top_p", 0.9),
        ("min_p", 0.05),
        ("repetition_penalty", 1.05),
        ("generation_kwargs", {"presence_penalty": 0.5}),
    ],
)
def test_numeric_settings_out_of_range_fail_with_the_field_named(tmp_path, field, value):
    with pytest.raises(ValueError, match=field.split("_kwargs")[0]):
        _args(tmp_path, **{field: value})
    with pytest.raises(ValueError, match="env_error_policy"):
        _args(tmp_path, env_error_policy="ignore")
    with pytest.raises(ValueError, match="Known starpo envs"):
        _args(tmp_path, env_id="starpo/Typo-v0")


def test_train_cli_refuses_a_bad_template_before_loading_the_model(tmp_path, tiny_tokenizer):
    import subprocess
    import sys

    from starpo_trl.tiny import save_tiny

    path = save_tiny(str(tmp_path / "model"), hidden_size=32, num_layers=1)
    (tmp_path / "model" / "model.safetensors").write_bytes(b"not a model")  # loading it would fail differently
    cfg = tmp_path / "model" / "chat_template.jinja"
    cfg.write_text(
        "{%- for m in messages %}{%- if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}<|im_end|>{%- endif %}{%- endfor %}"
    )
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "--model_name_or_path",
            path,
            "--env_id",
            "starpo/Bandit-v0",
            "--output_dir",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "prefix-preserving" in res.stderr


def test_resume_continues_with_the_same_start_states_and_metrics(tmp_path, tiny_tokenizer):
    from starpo_trl.tiny import build_tiny_model

    def run(out, max_steps, resume=None):
        args = _args(
            out,
            env_id="starpo/Sokoban-v0",
            max_steps=max_steps,
            save_strategy="steps",
            save_steps=2,
            env_step_timeout=None,
        )
        trainer = MultiTurnStarPOTrainer(
            build_tiny_model(tiny_tokenizer, seed=3, hidden_size=32, num_layers=1),
            args,
            processing_class=tiny_tokenizer,
        )
        seen = []
        play = trainer.play
        trainer.play = lambda starts, t: seen.append([s.seed for s in starts]) or play(starts, t)
        trainer.train(resume_from_checkpoint=resume)
        rows = [r for r in trainer.state.log_history if "reward" in r]
        return seen, rows

    full_seeds, full_rows = run(tmp_path / "full", 4)
    first_seeds, _ = run(tmp_path / "part", 2)
    resumed_seeds, resumed_rows = run(tmp_path / "part", 4, resume=str(tmp_path / "part" / "checkpoint-2"))
    assert first_seeds + resumed_seeds == full_seeds
    for a, b in zip(full_rows[-2:], resumed_rows[-2:]):
        assert a["step"] == b["step"] and a["reward"] == pytest.approx(b["reward"], abs=1e-6)
        assert a["env/Sokoban-v0/success"] == b["env/Sokoban-v0/success"]
        # the first resumed step still compares its reasoning with the step before the checkpoint
        assert "reasoning/similarity_to_previous_step" in b
        assert a["reasoning/similarity_to_previous_step"] == pytest.approx(b["reasoning/similarity_to_previous_step"])


def test_no_eval_exec_or_shell_in_library_code():
    pattern = re.compile(r"(?<![.\w])(eval|exec)\(|os\.system|subprocess|pickle\.load")  # model.eval() is fine
    offenders = [
        f"{path}:{i}"
        for folder in ("starpo_trl", "envs")
        for path in (ROOT / folder).rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and "literal_eval" not in line
    ]
    assert offenders == []


def test_checkpoints_are_safetensors(tmp_path, tiny_tokenizer, small_model):
    args = _args(
        tmp_path,
        env_id="starpo/Bandit-v0",
        max_steps=1,
        save_strategy="steps",
        save_steps=1,
        advantage_estimator="gae",
        max_turns=1,
    )
    MultiTurnStarPOTrainer(small_model, args, processing_class=tiny_tokenizer).train()
    ckpt = tmp_path / "checkpoint-1"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "value_model" / "critic.safetensors").exists()


@pytest.mark.parametrize("policy", ["exclude", "failure_reward"])
def test_a_step_with_no_model_token_is_skipped_then_training_stops(
    tmp_path, tiny_tokenizer, small_model, scripted, policy
):
    from datasets import Dataset

    starts = Dataset.from_dict({"seed": [101, 111, 121, 131]})  # every reset raises: no episode gets a model token
    backend = scripted("<think>x</think><answer>Up</answer>")
    before = {k: v.clone() for k, v in small_model.state_dict().items()}
    args = _args(tmp_path, env_error_policy=policy, max_steps=2, env_step_timeout=None, weight_decay=0.1)
    trainer = MultiTurnStarPOTrainer(
        small_model, args, processing_class=tiny_tokenizer, train_dataset=starts, backend=backend
    )
    trainer.train()
    assert [row["rollout/empty_step"] for row in trainer.state.log_history if "rollout/empty_step" in row] == [
        1.0,
        1.0,
    ]
    # skipped: no optimizer update at all (weight decay alone would have moved every weight)
    assert all(torch.equal(before[k], v) for k, v in small_model.state_dict().items())
    args = _args(tmp_path, env_error_policy=policy, max_steps=4, max_empty_steps=3, env_step_timeout=None)
    trainer = MultiTurnStarPOTrainer(
        small_model, args, processing_class=tiny_tokenizer, train_dataset=starts, backend=backend
    )
    with pytest.raises(TrainingStopped, match="3 steps in a row had no model token"):
        trainer.train()
