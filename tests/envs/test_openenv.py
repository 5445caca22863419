"""OpenEnv both ways: our envs served by `python -m envs.serve` (one session per client; a stock
OpenEnv client plays it) and a running server played as `starpo/OpenEnv-v0`, in training too;
a server that dies mid-episode ends those episodes as env errors, not a hung trainer. Servers run
on 127.0.0.1 on a free port and are always stopped."""

import pathlib
import socket
import sys
import time

import gymnasium as gym
import pytest

import envs  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the server helper the benchmarks use too

from local_server import local_server  # noqa: E402

SERVER_START_S = 300


def serve(env_id: str, env_kwargs: str = "{}", log: pathlib.Path | None = None):
    """``envs.local_server`` with the tests' start ceiling."""
    return local_server(env_id, env_kwargs, log, start_timeout=SERVER_START_S)


@pytest.fixture(scope="module")
def server_log(tmp_path_factory):
    return tmp_path_factory.mktemp("openenv") / "server.stderr"


@pytest.fixture(scope="module")
def sokoban_server(server_log):
    with serve("starpo/Sokoban-v0", log=server_log) as (url, _):
        yield url


def test_served_env_plays_as_the_env_itself(sokoban_server):
    remote = gym.make("starpo/OpenEnv-v0", base_url=sokoban_server)
    local = gym.make("starpo/Sokoban-v0")
    try:
        for seed in range(3):
            assert remote.reset(seed=seed)[0] == local.reset(seed=seed)[0]
            assert remote.unwrapped.instructions == local.unwrapped.instructions
            assert remote.unwrapped.action_names == list(local.unwrapped.action_names)
            for _ in range(6):
                action = local.unwrapped.expert_action()
                r, l_ = remote.step(action), local.step(action)
                assert r[:4] == l_[:4] and r[4]["success"] == l_[4]["success"]
                if l_[2] or l_[3]:
                    break
    finally:
        remote.close()


def test_a_stock_openenv_client_plays_it_in_its_own_session(sokoban_server):
    from openenv.core.generic_client import GenericEnvClient

    local = gym.make("starpo/Sokoban-v0")
    with GenericEnvClient(base_url=sokoban_server).sync() as a, GenericEnvClient(base_url=sokoban_server).sync() as b:
        first = a.reset(seed=1).observation["text"]
        assert b.reset(seed=2).observation["text"] == local.reset(seed=2)[0]  # another session, its own env
        local.reset(seed=1)
        action = local.unwrapped.expert_action()
        step = a.step({"text": action})
        assert first == gym.make("starpo/Sokoban-v0").reset(seed=1)[0]
        assert step.observation["text"] == local.step(action)[0] and step.done is False


def test_closing_a_session_logs_no_traceback(sokoban_server, server_log):
    """openenv-core closes an already closed socket after every normal client close; its WebSocketDisconnect
    was logged as a ~60-line traceback per episode (#45, item 6)."""
    for seed in range(2):
        remote = gym.make("starpo/OpenEnv-v0", base_url=sokoban_server)
        remote.reset(seed=seed)
        remote.step("Up")
        remote.close()
    time.sleep(1.0)  # the server handles the close after the client returns
    log = server_log.read_text()
    assert "Traceback" not in log and "WebSocketDisconnect" not in log, log[-2000:]


def test_the_quiet_close_middleware_hides_only_a_websocket_disconnect():
    import asyncio

    from starlette.websockets import WebSocketDisconnect

    from envs.serve import QuietClientClose

    def app_raising(error):
        async def app(scope, receive, send):
            raise error

        return QuietClientClose(app)

    asyncio.run(app_raising(WebSocketDisconnect(1006))({"type": "websocket"}, None, None))  # the client left
    with pytest.raises(ValueError, match="a real error"):
        asyncio.run(app_raising(ValueError("a real error"))({"type": "websocket"}, None, None))
    with pytest.raises(WebSocketDisconnect):
        asyncio.run(app_raising(WebSocketDisconnect(1006))({"type": "http"}, None, None))


def test_training_through_the_adapter_matches_in_process_episodes(
    sokoban_server, tiny_tokenizer, fresh_model, tmp_path
):
    from conftest import ScriptedBackend
    from helpers import make_args

    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState

    moves = ["Up", "Left", "Down", "Right"]
    backend = lambda: ScriptedBackend(  # noqa: E731
        tiny_tokenizer,
        lambda call, i: f"<think>go</think><answer>{moves[(call + i) % 4]}</answer>",
        tiny_tokenizer.eos_token_id,
    )
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=16, env_runner="threads")
    remote_kwargs = (("base_url", sokoban_server),)
    played = {}
    for name, starts in (
        ("remote", [StartState("starpo/OpenEnv-v0", s, remote_kwargs) for s in range(4)]),
        ("local", [StartState("starpo/Sokoban-v0", s) for s in range(4)]),
    ):
        engine = RolloutEngine(tiny_tokenizer, backend(), cfg, [tiny_tokenizer.eos_token_id])
        played[name] = engine.run(starts)
        engine.close()
    for r, l_ in zip(played["remote"], played["local"]):
        assert r.env_error is None and r.messages == l_.messages and r.turn_rewards == l_.turn_rewards
        assert r.success == l_.success and r.prompt_ids == l_.prompt_ids and r.completion_ids == l_.completion_ids
    args = make_args(
        tmp_path,
        env_id="starpo/OpenEnv-v0",
        env_kwargs={"base_url": sokoban_server},
        max_turns=2,
        env_runner="threads",
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(row.get("env/errors", 0) == 0 for row in trainer.state.log_history)


def test_a_server_that_dies_mid_episode_ends_those_episodes_as_env_errors(tiny_tokenizer):
    from conftest import ScriptedBackend

    from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState

    with serve("starpo/Sokoban-v0") as (url, proc):

        def reply(call, i):
            if call == 0 and i == 0:
                proc.kill()  # after every episode's reset, before their first step
                proc.wait()
            return "<think>go</think><answer>Up</answer>"

        backend = ScriptedBackend(tiny_tokenizer, reply, tiny_tokenizer.eos_token_id)
        cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=16, env_runner="threads")
        engine = RolloutEngine(tiny_tokenizer, backend, cfg, [tiny_tokenizer.eos_token_id])
        start = time.time()
        episodes = engine.run(
            [StartState("starpo/OpenEnv-v0", s, (("base_url", url), ("timeout_s", 5.0))) for s in range(3)]
        )
        engine.close()
        assert time.time() - start < 30
        assert all(ep.env_error is not None and ep.env_error.startswith("step") for ep in episodes)
        # a server that is not there at all: the reset fails, the episode is an env error too
        (ep,) = RolloutEngine(tiny_tokenizer, backend, cfg, [tiny_tokenizer.eos_token_id]).run(
            [StartState("starpo/OpenEnv-v0", 0, (("base_url", url),))]
        )
        assert ep.env_error.startswith("reset")


def test_a_server_slower_than_the_timeout_ends_the_episode_as_an_env_error(tiny_tokenizer):
    from conftest import ScriptedBackend

    from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState

    with serve("starpo/Sleepy-v0", '{"latency": 10.0}') as (url, _):  # every step takes 10 s
        backend = ScriptedBackend(tiny_tokenizer, "<think>x</think><answer>ok</answer>", tiny_tokenizer.eos_token_id)
        cfg = RolloutConfig(max_turns=1, max_tokens_per_turn=16, env_runner="threads")
        engine = RolloutEngine(tiny_tokenizer, backend, cfg, [tiny_tokenizer.eos_token_id])
        start = time.time()
        kwargs = (("base_url", url), ("timeout_s", 0.3))
        episodes = engine.run([StartState("starpo/OpenEnv-v0", s, kwargs) for s in range(2)])
        engine.close()
        assert time.time() - start < 6.0  # the trainer waited for the timeout, not for the server
        assert all(ep.env_error is not None and ep.env_error.startswith("step") for ep in episodes)


def test_a_server_that_cannot_be_reached_leaks_no_client_thread():
    """Each failed connect used to leave the sync client's event-loop thread running: one per episode (#45, item 2)."""
    import threading

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def loops():
        return sum(t.name == "openenv-sync-client-loop" and t.is_alive() for t in threading.enumerate())

    before = loops()
    for seed in range(4):
        env = gym.make("starpo/OpenEnv-v0", base_url=f"http://127.0.0.1:{port}", connect_timeout_s=2.0)
        with pytest.raises(Exception):
            env.reset(seed=seed)
        env.close()
    assert loops() == before
