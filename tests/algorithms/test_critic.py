import helpers
import pytest
import torch

from starpo_trl import MultiTurnStarPOTrainer, StarPOConfig
from starpo_trl.algorithms.critic import make_critic
from starpo_trl.algorithms.value_model import CRITIC_ADAPTER, explained_variance, value_loss


@pytest.fixture
def policy(tiny_tokenizer):
    from starpo_trl.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer, seed=2, hidden_size=32, num_layers=1)


def _lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def lora_policy(policy):
    from peft import get_peft_model

    return get_peft_model(policy, _lora_config())


def test_value_loss_by_hand():
    values, old, returns = torch.tensor([[0.8, 0.2]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0]])
    mask = torch.tensor([[1, 0]])
    loss, clipfrac = value_loss(values, old, returns, mask, clip=0.5)
    # token 0: unclipped (0.8 - 1)^2 = 0.04, clipped (0.5 - 1)^2 = 0.25 -> 0.25; token 1 masked
    assert loss.item() == pytest.approx(0.125) and clipfrac.item() == 1.0
    loss, _ = value_loss(values, old, returns, mask, clip=None)
    assert loss.item() == pytest.approx(0.02)


def test_value_clip_fraction_counts_only_tokens_that_left_the_range():
    # inside the range old + (v - old) rounds away from v in float32 for these values; nothing is clipped
    torch.manual_seed(0)
    values = torch.rand(64, 32) * 0.01
    old = values + torch.rand(64, 32) * 0.45  # within 0.45 < 0.5 of v
    returns = torch.rand(64, 32)
    assert (old + (values - old).clamp(-0.5, 0.5) != values).any()  # the rounding the old formula counted
    loss, clipfrac = value_loss(values, old, returns, torch.ones(64, 32), clip=0.5)
    assert clipfrac.item() == 0.0
    assert loss.item() == pytest.approx(0.5 * ((values - returns) ** 2).mean().item(), rel=1e-6)
    # half the tokens pushed 1.0 away from old: clipped where the clipped loss is larger
    far = old + torch.where(torch.arange(32) < 16, 1.0, 0.0)
    _, clipfrac = value_loss(far, old, returns, torch.ones(64, 32), clip=0.5)
    expected = ((torch.clamp(far, old - 0.5, old + 0.5) - returns) ** 2 > (far - returns) ** 2).float().mean()
    assert clipfrac.item() == pytest.approx(expected.item()) and 0 < clipfrac.item() <= 0.5


def test_explained_variance_over_model_tokens_only():
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(returns) + 2.0, returns, mask) == pytest.approx(0.0)


def test_full_critic_starts_from_policy_weights_and_learns(policy):
    critic = make_critic(policy, "full", learning_rate=1e-2, value_clip=None)
    for (n, p), (_, q) in zip(critic.model.backbone.named_parameters(), policy.model.named_parameters()):
        assert torch.equal(p, q), n
    ids = torch.randint(0, 100, (4, 10))
    attn = torch.ones_like(ids)
    returns = torch.tensor([[1.0] * 6, [0.0] * 6, [0.5] * 6, [2.0] * 6])
    mask = torch.ones(4, 6)
    assert torch.equal(critic.values(ids, attn, 6, 2), torch.zeros(4, 6))  # zero-initialised head
    first = critic.step(ids, attn, 6, torch.zeros(4, 6), returns, mask)["value_loss"]
    for _ in range(60):
        last = critic.step(ids, attn, 6, torch.zeros(4, 6), returns, mask)["value_loss"]
    assert last < first / 5
    before = [p.clone() for p in policy.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))  # the policy is untouched


def test_lora_critic_trains_only_its_adapter_and_head(policy):
    peft = lora_policy(policy)
    critic = make_critic(peft, "lora", learning_rate=1e-2)
    names = [n for n, _ in peft.named_parameters()]
    assert any(f".{CRITIC_ADAPTER}." in n for n in names)
    snapshot = {n: p.clone() for n, p in peft.named_parameters()}
    ids = torch.randint(0, 100, (2, 8))
    for _ in range(3):
        critic.step(ids, torch.ones_like(ids), 4, torch.zeros(2, 4), torch.ones(2, 4), torch.ones(2, 4))
    changed = {n for n, p in peft.named_parameters() if not torch.equal(p, snapshot[n])}
    assert changed and all(f".{CRITIC_ADAPTER}." in n for n in changed)
    assert peft.active_adapter == "default"
    assert len(critic.trainable_parameters()) == len([n for n in names if f".{CRITIC_ADAPTER}." in n]) + 2


def test_critic_refuses_lora_without_peft(policy):
    with pytest.raises(ValueError, match="PEFT"):
        make_critic(policy, "lora")


def test_critic_save_and_load_restore_exactly(policy, tmp_path):
    critic = make_critic(policy, "full", learning_rate=1e-2)
    ids = torch.randint(0, 100, (2, 8))
    critic.step(ids, torch.ones_like(ids), 4, torch.zeros(2, 4), torch.ones(2, 4), torch.ones(2, 4))
    critic.save(str(tmp_path))
    saved = [p.clone() for p in critic.trainable_parameters()]
    critic.step(ids, torch.ones_like(ids), 4, torch.zeros(2, 4), torch.ones(2, 4), torch.ones(2, 4))
    critic.load(str(tmp_path))
    assert all(torch.equal(a, b) for a, b in zip(saved, critic.trainable_parameters()))
    # the AdamW moments come back too: the step after each load lands on the same weights
    critic.step(ids, torch.ones_like(ids), 4, torch.zeros(2, 4), torch.ones(2, 4), torch.ones(2, 4))
    once = [p.clone() for p in critic.trainable_parameters()]
    critic.load(str(tmp_path))
    critic.step(ids, torch.ones_like(ids), 4, torch.zeros(2, 4), torch.ones(2, 4), torch.ones(2, 4))
    assert all(torch.equal(a, b) for a, b in zip(once, critic.trainable_parameters()))


def test_critic_holders_refuse_a_checkpoint_of_another_kind(policy, tmp_path):
    from starpo_trl.algorithms.critic import ENGINE_TAG, ReplicatedCritic

    critic = make_critic(policy, "full")
    assert isinstance(critic, ReplicatedCritic) and not critic.sharded  # one process: plain AdamW
    critic.save(str(tmp_path / "plain"))
    (tmp_path / "plain" / ENGINE_TAG).mkdir()  # as a DeepSpeed critic leaves it
    with pytest.raises(ValueError, match="saved under DeepSpeed and this critic runs without it"):
        critic.load(str(tmp_path / "plain"))
    lora = make_critic(lora_policy(policy), "lora")
    lora.save(str(tmp_path / "lora"))
    with pytest.raises(ValueError, match="another critic_type"):
        critic.load(str(tmp_path / "lora"))
    with pytest.raises(ValueError, match="sharded critic needs critic_type='full'"):
        make_critic(policy, "lora", deepspeed_config={})


# the critic's runs: a few Sokoban turns, every group kept (helpers.make_args is the one factory; these its changes)
CRITIC_RUN = dict(
    env_id="starpo/Sokoban-v0",
    num_start_states=2,
    rollout_filter_ratio=1.0,
    gradient_accumulation_steps=2,
    max_turns=3,
    max_tokens_per_turn=10,
    critic_learning_rate=1e-3,
    disable_tqdm=True,
    num_eval_episodes=256,
)


def make_args(tmp_path, **kw):
    return helpers.make_args(tmp_path, **{**CRITIC_RUN, **kw})


@pytest.mark.parametrize("estimator", ["gae", "bilevel_gae", "turn_gae"])
def test_trainer_critic_advantages_are_per_token_and_masked(tmp_path, tiny_tokenizer, policy, estimator):
    args = make_args(tmp_path, advantage_estimator=estimator, use_turn_rewards=True)
    trainer = MultiTurnStarPOTrainer(policy, args, processing_class=tiny_tokenizer)
    batch = trainer._generate_and_score_completions([{"seed": s} for s in range(2) for _ in range(4)])
    adv, mask = batch["advantages"], batch["completion_mask"] * batch["tool_mask"]
    assert adv.shape == batch["completion_ids"].shape
    assert torch.equal(adv[mask == 0], torch.zeros_like(adv[mask == 0]))
    assert torch.equal(batch["returns"][mask == 0], torch.zeros_like(adv[mask == 0]))
    # the critic starts at zero, so each episode's return at its first model token is its total reward
    # (gamma = lambda = 1, turn discount only for bi-level)
    if estimator == "gae":
        first = mask.float().argmax(dim=1)
        totals = batch["returns"][torch.arange(len(first)), first]
        assert torch.all(totals < 0)  # step costs and format penalties of an untrained model


def test_critic_advantages_are_whitened_over_model_tokens_and_the_value_targets_chosen(
    tmp_path, tiny_tokenizer, policy
):
    from starpo_trl.algorithms import whiten

    seeds = [{"seed": s} for s in range(2) for _ in range(4)]
    raw_args = make_args(tmp_path, advantage_estimator="turn_gae", use_turn_rewards=True, whiten_advantages=False)
    torch.manual_seed(0)
    raw = MultiTurnStarPOTrainer(policy, raw_args, processing_class=tiny_tokenizer)._generate_and_score_completions(
        seeds
    )
    args = make_args(tmp_path, advantage_estimator="turn_gae", use_turn_rewards=True, value_loss_tokens="turn_ends")
    torch.manual_seed(0)
    trainer = MultiTurnStarPOTrainer(policy, args, processing_class=tiny_tokenizer)
    batch = trainer._generate_and_score_completions(seeds)
    mask = batch["completion_mask"] * batch["tool_mask"]
    assert torch.equal(batch["completion_ids"], raw["completion_ids"])  # the same episodes
    adv = batch["advantages"][mask.bool()]
    assert abs(adv.mean().item()) < 1e-5 and adv.std().item() == pytest.approx(1.0, abs=1e-4)
    assert torch.allclose(batch["advantages"], whiten(raw["advantages"], mask), atol=1e-6)
    # turn_ends: the critic's targets are each turn's last model token only, where the return is G_k
    ends = torch.zeros_like(mask)
    for row in range(len(mask)):
        model = mask[row].nonzero().flatten().tolist()
        for a, b in zip(model, model[1:] + [None]):
            if b is None or b != a + 1:  # last model token before an env span or the end
                ends[row, a] = 1
    assert torch.equal(batch["value_mask"], ends) and torch.equal(raw["value_mask"], mask)


def test_trainer_trains_and_resumes_the_critic(tmp_path, tiny_tokenizer, policy):
    args = make_args(tmp_path, advantage_estimator="gae", save_strategy="steps", save_steps=2, max_steps=2)
    trainer = MultiTurnStarPOTrainer(policy, args, processing_class=tiny_tokenizer)
    start = [p.clone() for p in trainer.critic.trainable_parameters()]
    trainer.train()
    trained = [p.clone() for p in trainer.critic.trainable_parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(start, trained))
    logged = {k for row in trainer.state.log_history for k in row}
    assert {
        "critic/value_loss",
        "critic/value_clipfrac",
        "critic/explained_variance",
        "advantages/mean",
        "returns/mean",
    } <= logged
    assert (tmp_path / "checkpoint-2" / "value_model" / "critic.safetensors").exists()

    from starpo_trl.tiny import build_tiny_model

    fresh = MultiTurnStarPOTrainer(
        build_tiny_model(tiny_tokenizer, seed=5, hidden_size=32, num_layers=1), args, processing_class=tiny_tokenizer
    )
    fresh.load_critic(str(tmp_path / "checkpoint-2"))
    assert all(torch.equal(a, b) for a, b in zip(trained, fresh.critic.trainable_parameters()))
    # Trainer's own resume restores it: a fresh critic (zero head) would predict exactly 0 at step 3
    resumed = MultiTurnStarPOTrainer(
        build_tiny_model(tiny_tokenizer, seed=5, hidden_size=32, num_layers=1),
        make_args(tmp_path, advantage_estimator="gae", max_steps=3),
        processing_class=tiny_tokenizer,
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    step3 = [row for row in resumed.state.log_history if row.get("step") == 3 and "values/std" in row]
    assert step3 and step3[-1]["values/std"] > 0


def test_loss_aggregation_maps_onto_trl_loss_types(tmp_path):
    assert make_args(tmp_path, loss_aggregation="token-mean").loss_type == "dapo"
    assert make_args(tmp_path, loss_aggregation="seq-mean-token-mean").loss_type == "grpo"
    assert make_args(tmp_path, loss_aggregation="seq-mean-token-sum").loss_type == "luspo"
    with pytest.raises(ValueError, match="loss_aggregation"):
        make_args(tmp_path, loss_aggregation="sum")
    with pytest.raises(ValueError, match="asym_clip"):
        make_args(tmp_path, use_turn_rewards=True, reward_normalization="asym_clip")


def test_critic_learns_a_return_that_is_predictable_end_to_end(tmp_path, tiny_tokenizer, fresh_model):
    """The untrained model never writes the format, so every Sokoban turn pays the -0.1 penalty: with turn rewards
    and gamma = 1 the return at a model token is -0.1 x (turns left, this one included), readable from the context.
    Through rollouts, GAE and the critic's own updates, the critic must come to explain most of its variance."""
    args = StarPOConfig(
        output_dir=str(tmp_path),
        env_id="starpo/Sokoban-v0",
        num_start_states=4,
        num_generations=4,
        rollout_filter_ratio=1.0,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        max_steps=12,
        max_turns=4,
        max_tokens_per_turn=6,
        advantage_estimator="gae",
        use_turn_rewards=True,
        critic_learning_rate=3e-3,
        learning_rate=1e-6,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        collapse_guard="off",
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    trainer.train()
    ev = [row["critic/explained_variance"] for row in trainer.state.log_history if "critic/explained_variance" in row]
    assert ev[0] == 0.0  # the value head starts at zero
    assert max(ev[-3:]) > 0.5, ev


def test_sharded_critic_optimizer_matches_plain_adamw_across_two_processes(tmp_path):
    """ZeRO-1 for the critic: each process keeps part of the AdamW state, the weights stay identical
    everywhere and equal a plain AdamW's, and the saved state is whole (a single process resumes it)."""
    from helpers import run_two_processes

    ranks = run_two_processes("dist_critic.py", tmp_path, 29541)
    for r in ranks:
        assert r["sharded"] and r["moved"]
        assert r["max_diff"] < 1e-6 and r["resume_diff"] < 1e-6
        assert r["saved_state"] == r["num_params"]  # gathered: every parameter's moments
    assert (
        0 < ranks[0]["local_state"] < ranks[0]["num_params"]
        and ranks[0]["local_state"] + ranks[1]["local_state"] == ranks[0]["num_params"]
    )
    assert ranks[0]["digests"][0] == ranks[0]["digests"][1] == ranks[1]["digests"][0]
    # different initial weights per process: the sharded critic starts from process 0's (the unsharded one would not)
    assert ranks[0]["unsynced_digests"][0] != ranks[0]["unsynced_digests"][1]
    assert ranks[0]["start_digests"][0] == ranks[0]["start_digests"][1] == ranks[0]["unsynced_digests"][0]


@pytest.mark.parametrize("mode", ["zero2", "zero3", "zero3_offload", "fsdp"])
def test_sharded_critic_matches_plain_adamw_across_two_processes(tmp_path, mode):
    """The full critic sharded on 2 CPU processes (gloo): by its own DeepSpeed engine with the policy's ZeRO
    stage (ZeRO-2 shards its AdamW state, ZeRO-3 its weights too), or by Accelerate's FSDP2 as the policy
    is. Each matches an unsharded critic step for step, saves whole weights and resumes exactly."""
    from helpers import run_two_processes

    port = 29560 + ["zero2", "zero3", "zero3_offload", "fsdp"].index(mode)
    ranks = run_two_processes("dist_critic_sharded.py", tmp_path, port, mode)
    total = ranks[0]["total"]
    for r in ranks:
        assert r["moved"] and r["values_diff"] == 0.0  # same weights before training
        # each process keeps about half of the AdamW state; under ZeRO-3 and FSDP about half of the weights too
        assert total * 0.45 <= r["optimizer_local"] <= total * 0.55
        assert r["local"] == total if mode == "zero2" else total * 0.45 <= r["local"] <= total * 0.55
        assert r["max_diff"] < 1e-4  # three clipped AdamW steps at lr 1e-2: the same as the unsharded critic
        for sharded_norm, plain_norm in r["norms"]:  # gradient norms before clipping (0.05): equal
            assert sharded_norm == pytest.approx(plain_norm, rel=1e-5) and sharded_norm > 0.05
        assert r["saved_diff"] == 0.0 and r["resume_diff"] == 0.0
        if mode == "fsdp":  # the files of an unsharded critic: a plain critic resumes them, bit for bit
            # (FSDP's reduce-scatter sums in another order than one process: float32 rounding, 1e-7 here)
            assert r["max_diff"] < 1e-6 and r["plain_loads"] == "loaded" and r["plain_resume_diff"] == 0.0
        else:
            assert "saved under DeepSpeed" in r["plain_loads"]
            # from a policy partitioned at load (zero3_init_flag): the gathered weights, not empty shards
            assert r["partitioned_at_rest"] == 0 and r["partitioned_params"] > 0 and r["partitioned_copy_diff"] == 0.0
    if mode == "fsdp":  # the shards add up to the whole critic
        assert ranks[0]["local"] + ranks[1]["local"] == total
    assert ranks[0]["digests"][0] == ranks[0]["digests"][1] == ranks[1]["digests"][0]


def test_full_critic_can_start_from_another_models_weights(tiny_tokenizer, policy):
    from starpo_trl.tiny import build_tiny_model

    other = build_tiny_model(tiny_tokenizer, seed=9, hidden_size=48, num_layers=2)
    critic = make_critic(policy, "full", init_from=other)
    pairs = list(zip(critic.model.backbone.named_parameters(), other.model.named_parameters()))
    assert len(pairs) == len(list(other.model.parameters())) and all(
        n == m and torch.equal(p, q) for (n, p), (m, q) in pairs
    )
    assert critic.model.head.in_features == 48  # sized from the value model, not the policy (32)
    ids = torch.randint(5, 100, (2, 7))
    assert critic.values(ids, torch.ones_like(ids), 3, 2).shape == (2, 3)
    with pytest.raises(ValueError, match="critic_type='full'"):
        make_critic(lora_policy(policy), "lora", init_from=other)


def test_trainer_value_model_and_critic_epochs(tmp_path, tiny_tokenizer, policy, monkeypatch):
    from starpo_trl.tiny import build_tiny_model

    with pytest.raises(ValueError, match="value_model is only used by a critic"):
        MultiTurnStarPOTrainer(policy, make_args(tmp_path), processing_class=tiny_tokenizer, value_model=policy)
    with pytest.raises(ValueError, match="critic_epochs"):
        make_args(tmp_path, advantage_estimator="gae", critic_epochs=0)
    other = build_tiny_model(tiny_tokenizer, seed=9, hidden_size=48, num_layers=2)
    args = make_args(tmp_path, advantage_estimator="gae", critic_epochs=3, max_steps=1)
    trainer = MultiTurnStarPOTrainer(policy, args, processing_class=tiny_tokenizer, value_model=other)
    assert torch.equal(trainer.critic.model.backbone.embed_tokens.weight, other.model.embed_tokens.weight)
    calls = []
    update = trainer.critic.step
    monkeypatch.setattr(trainer.critic, "step", lambda ids, *a, **k: calls.append(ids.clone()) or update(ids, *a, **k))
    trainer.train()
    # 3 passes over the rollout batch, each split into steps_per_generation micro-batches of equal size
    assert len(calls) == 3 * args.steps_per_generation
    rows = args.per_device_train_batch_size * args.steps_per_generation
    assert all(len(c) == args.per_device_train_batch_size for c in calls)
    epochs = [
        torch.cat(calls[i : i + args.steps_per_generation]) for i in range(0, len(calls), args.steps_per_generation)
    ]
    for epoch in epochs:  # every pass sees every row once: the same rows, as a set, as the first pass
        assert len(epoch) == rows
        assert sorted(map(tuple, epoch.tolist())) == sorted(map(tuple, epochs[0].tolist()))


@pytest.mark.parametrize("backend", ["fsdp", "zero3"])
def test_lora_critic_is_refused_where_the_policy_is_sharded(tmp_path, policy, backend):
    """FSDP and ZeRO-3 shard the policy, and with it the LoRA critic's adapter: build_critic (which the
    trainer calls while it is built, before training) refuses it clearly. They need several processes:
    the accelerator state here says which one is in use."""
    from types import SimpleNamespace

    from starpo_trl.algorithms.critic import build_critic

    state = SimpleNamespace(
        fsdp_plugin=object() if backend == "fsdp" else None,
        deepspeed_plugin=SimpleNamespace(zero_stage=3) if backend == "zero3" else None,
    )
    from starpo_trl.algorithms.settings import CriticSettings

    accelerator = SimpleNamespace(state=state, mixed_precision="no")
    run = dict(micro_batch=2, max_grad_norm=1.0, weight_decay=0.0)
    with pytest.raises(ValueError, match="critic_type='full'"):
        build_critic(policy, CriticSettings(critic_type="lora"), "gae", accelerator, **run)
    assert build_critic(policy, CriticSettings(critic_type="lora"), "grpo", accelerator, **run) is None  # no critic
