"""Context windows: each turn's prompt is what the model read (a fresh first message with the state
K turns ago, then the last K turns' tokens as they were), each turn is a training row of exactly
those tokens plus the reply, and the sampling logprobs are reproduced by a forward pass over it."""

import gymnasium as gym
import pytest
import torch
from conftest import ScriptedBackend, assert_logprobs_match_a_forward_pass
from helpers import make_args

import envs  # noqa: F401
from starpo_trl import MultiTurnStarPOTrainer
from starpo_trl.rollout import HFBackend, RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.batch import episode_rows
from starpo_trl.rollout.prompting import first_user_message, parse_reply
from starpo_trl.rollout.settings import context_window_turns

LAKE = (("is_slippery", False),)
MOVES = ["Right", "Down", "Left", "Up"]


def scripted(tok):
    return ScriptedBackend(
        tok, lambda call, i: f"<think>go</think><answer>{MOVES[(call + i) % 4]}</answer>", tok.eos_token_id
    )


def play(tok, backend, window, seeds=range(4), turns=4, temperature=1.0):
    cfg = RolloutConfig(max_turns=turns, max_tokens_per_turn=16, context_window=window, max_actions_per_turn=1)
    engine = RolloutEngine(tok, backend, cfg, [tok.eos_token_id])
    return engine, engine.run([StartState("starpo/FrozenLake-v0", s, LAKE) for s in seeds], temperature)


def observations(ep) -> list[str]:
    """The lake before each turn, replayed from the episode's own replies (non-slippery: deterministic)."""
    env = gym.make("starpo/FrozenLake-v0", is_slippery=False)
    obs, _ = env.reset(seed=ep.start.seed)
    seen = [obs]
    for message in ep.messages[1::2]:
        for action in parse_reply(message["content"], True, split_actions=True, max_actions=1).actions:
            obs, *_ = env.step(action)
        seen.append(obs)
    return seen


def test_window_forms():
    assert [context_window_turns(v) for v in ("full", "single_turn", "window:1", "window:3")] == [None, 0, 1, 3]
    for bad in ("window:0", "window", "last:2", "window:x"):
        with pytest.raises(ValueError, match="context_window"):
            context_window_turns(bad)


@pytest.mark.parametrize("window,k", [("window:1", 1), ("window:2", 2), ("single_turn", 0)])
def test_each_turn_reads_the_state_k_turns_ago_then_the_last_k_turns(tiny_tokenizer, window, k):
    engine, episodes = play(tiny_tokenizer, scripted(tiny_tokenizer), window)
    cfg, env = engine.config, gym.make("starpo/FrozenLake-v0", is_slippery=False)
    multi = [ep for ep in episodes if len(ep.turn_prompts) >= 3]
    assert multi, "no episode lasted three turns: the check is vacuous"
    for ep in episodes:
        seen = observations(ep)
        assert len(ep.turn_prompts) == ep.num_turns
        for t, prompt in enumerate(ep.turn_prompts):
            if t <= k and k > 0:  # the whole history still fits the window
                assert prompt == ep.prompt_ids + ep.completion_ids[: ep.reply_starts[t]]
                continue
            head = engine.chat.prompt_ids(first_user_message(env.unwrapped, seen[t - k], 1, cfg.max_turns, True))
            tail = ep.completion_ids[ep.reply_starts[t - k] : ep.reply_starts[t]] if k else []
            assert prompt == head + tail
        assert tiny_tokenizer.decode(ep.turn_prompts[0]) == tiny_tokenizer.decode(ep.prompt_ids)


def test_a_window_as_long_as_the_episode_is_the_full_history(tiny_tokenizer):
    _, full = play(tiny_tokenizer, scripted(tiny_tokenizer), "full")
    _, wide = play(tiny_tokenizer, scripted(tiny_tokenizer), "window:4")
    for a, b in zip(full, wide):
        assert a.completion_ids == b.completion_ids and a.messages == b.messages and not a.turn_prompts
        assert b.turn_prompts == [b.prompt_ids + b.completion_ids[:s] for s in b.reply_starts]
        assert episode_rows([a])[0] == [a]


@pytest.mark.parametrize("window", ["window:1", "single_turn"])
def test_rows_are_the_sampled_tokens_and_their_logprobs_reforward(tiny_tokenizer, tiny_model, window):
    torch.manual_seed(0)
    backend = HFBackend(tiny_model, tiny_tokenizer.pad_token_id, [tiny_tokenizer.eos_token_id])
    _, episodes = play(tiny_tokenizer, backend, window, seeds=range(3), turns=3, temperature=0.7)
    rows, owner = episode_rows(episodes)
    assert len(rows) == sum(ep.num_turns for ep in episodes) and owner == sorted(owner)
    for row in rows:
        assert all(m == 1 for m in row.env_mask)  # a row's completion is its reply only
        assert_logprobs_match_a_forward_pass(tiny_model, row, temperature=0.7)
    for ep in episodes:  # the replies, verbatim, are the episode's model tokens in order
        mine = [t for row, o in zip(rows, owner) if episodes[o] is ep for t in row.completion_ids]
        assert mine == [t for t, m in zip(ep.completion_ids, ep.env_mask) if m]


def test_training_with_a_window_trains_one_row_per_turn(tmp_path, tiny_tokenizer, fresh_model):
    args = make_args(
        tmp_path,
        env_id="starpo/FrozenLake-v0",
        env_kwargs={"is_slippery": False},
        context_window="single_turn",
        max_turns=3,
        max_steps=1,
        rollout_filter_ratio=1.0,
        max_actions_per_turn=1,
    )
    trainer = MultiTurnStarPOTrainer(
        fresh_model, args, processing_class=tiny_tokenizer, backend=scripted(tiny_tokenizer)
    )
    batches = []
    step = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(step(inputs)) or batches[-1]
    played = []
    play_ = trainer.play
    trainer.play = lambda starts, t: played.append(play_(starts, t)) or played[-1]
    trainer.train()
    episodes = played[0]
    rows, _ = episode_rows(list(episodes))
    batch = batches[0]
    assert len(batch["completion_ids"]) >= len(rows) > len(episodes)  # one row per turn (plus padding)
    model_tokens = sum(sum(ep.env_mask) for ep in episodes if ep.env_error is None)
    assert int(batch["num_items_in_batch"]) == model_tokens
    logged = [row["rollout/tokens_trained"] for row in trainer.state.log_history if "rollout/tokens_trained" in row]
    assert logged[0] == sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)  # what the rows hold
    with pytest.raises(ValueError, match="loss_type"):
        make_args(tmp_path, context_window="window:1", loss_aggregation="seq-mean-token-mean")
    with pytest.raises(ValueError, match="context_window"):
        make_args(tmp_path, context_window="last:2")


def test_a_critic_trains_on_turn_rows(tmp_path, tiny_tokenizer, fresh_model):
    """With a window and GAE: per-token advantages on every turn row (zero off its reply and on the
    padding), value targets where the loss is, and the critic updated."""
    args = make_args(
        tmp_path,
        env_id="starpo/FrozenLake-v0",
        env_kwargs={"is_slippery": False},
        context_window="window:1",
        advantage_estimator="gae",
        max_turns=3,
        max_steps=1,
        rollout_filter_ratio=1.0,
        max_actions_per_turn=1,
    )

    def replies(call, i):  # some malformed replies: format penalties make the returns differ from zero
        return "no format" if (call + i) % 3 == 0 else f"<think>go</think><answer>{MOVES[(call + i) % 4]}</answer>"

    backend = ScriptedBackend(tiny_tokenizer, replies, tiny_tokenizer.eos_token_id)
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer, backend=backend)
    before = [p.detach().clone() for p in trainer.critic.trainable_parameters()]
    batches = []
    step = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(step(inputs)) or batches[-1]
    trainer.train()
    batch = batches[0]
    mask = batch["completion_mask"] * batch["tool_mask"]
    assert batch["advantages"].shape == mask.shape and len(mask) > args.num_start_states * args.num_generations
    assert batch["advantages"][mask == 0].abs().sum() == 0 and batch["advantages"][mask == 1].abs().sum() > 0
    assert torch.equal(batch["value_mask"], mask) and batch["returns"][mask == 0].abs().sum() == 0
    after = trainer.critic.trainable_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    logged = {k for r in trainer.state.log_history for k in r}
    assert {"critic/value_loss", "critic/explained_variance"} <= logged
