import pytest
import torch
from helpers import make_args

from starpo_trl import MultiTurnStarPOTrainer
from starpo_trl.monitoring.empty_steps import TrainingStopped


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="Known starpo envs"):
        make_args(tmp_path, env_id="starpo/Nope-v0")
    with pytest.raises(ValueError, match="rollout_filter_ratio"):
        make_args(tmp_path, rollout_filter_ratio=0.0)
    with pytest.raises(ValueError, match="steps_per_generation"):
        make_args(tmp_path, rollout_filter_ratio=0.25, per_device_train_batch_size=2)  # keeps 4 rows, 8 micro-batches
    with pytest.raises(ValueError, match="rollout_filter_metric"):
        make_args(tmp_path, rollout_filter_metric="var")
    with pytest.raises(ValueError, match="rollout_filter_strategy"):
        make_args(tmp_path, rollout_filter_strategy="top_q")
    with pytest.raises(ValueError, match="with top_p use a value in"):
        make_args(tmp_path, rollout_filter_strategy="top_p", rollout_filter_ratio=1.5)
    with pytest.raises(ValueError, match="top_k_abs is the number of groups kept"):
        make_args(tmp_path, rollout_filter_strategy="top_k_abs", rollout_filter_ratio=1.5)
    assert make_args(tmp_path, rollout_filter_strategy="top_k_abs", rollout_filter_ratio=3).fixed_kept_groups() == 3
    with pytest.raises(ValueError, match="rollout_filter_empty_stop_steps"):
        make_args(tmp_path, rollout_filter_empty_stop_steps=0)
    with pytest.raises(ValueError, match="mean rewards can be negative"):
        make_args(tmp_path, rollout_filter_strategy="min_p", rollout_filter_ratio=0.5, rollout_filter_metric="mean")
    with pytest.raises(ValueError, match="padding would dilute"):  # a varying kept count needs a batch-token loss
        make_args(
            tmp_path, rollout_filter_strategy="top_p", rollout_filter_ratio=0.9, loss_aggregation="seq-mean-token-mean"
        )
    with pytest.raises(ValueError, match="env_kwargs"):
        make_args(tmp_path, env_kwargs="{not json")


def test_train_steps_run_and_log_episode_metrics(tmp_path, tiny_tokenizer, fresh_model):
    trainer = MultiTurnStarPOTrainer(fresh_model, make_args(tmp_path), processing_class=tiny_tokenizer)
    trainer.train()
    logged = {k for row in trainer.state.log_history for k in row}
    for key in (
        "env/Bandit-v0/success",
        "env/Bandit-v0/pass@4",
        "env/Bandit-v0/valid_action_rate",
        "env/Bandit-v0/group_reward_std_mean",
        "env/Bandit-v0/frac_zero_std_groups",
        "rollout/kept_fraction",
        "entropy",
        "grad_norm",
        "clip_ratio/high_mean",
        "env/errors",
        "reasoning/reasoning_rate",
        "reasoning/distinct_2",
        "reasoning/template_share",
        "reasoning/similarity_to_previous_step",
    ):
        assert key in logged, key
    metrics = trainer.evaluate()
    assert 0.0 <= metrics["eval_success"] <= 1.0


def _batch(trainer, monkeypatch, rewards_by_row):
    """Run the overridden hook with the env rewards replaced by ``rewards_by_row`` (per trajectory)."""
    play = trainer.play

    def scored(starts, temperature):
        eps = play(starts, temperature)
        for ep, r in zip(eps, rewards_by_row):
            ep.turn_rewards = [float(r)]
        return eps

    monkeypatch.setattr(trainer, "play", scored)
    inputs = [{"seed": s} for s in range(4) for _ in range(4)]
    return trainer._generate_and_score_completions(inputs)


def test_filter_runs_before_any_forward_pass(tmp_path, tiny_tokenizer, fresh_model, monkeypatch):
    # gradient_accumulation_steps=2 < steps_per_generation=4, so old-policy logps are needed
    args = make_args(tmp_path, gradient_accumulation_steps=2)
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    rows = []
    real = trainer._get_per_token_logps_and_entropies
    monkeypatch.setattr(
        trainer,
        "_get_per_token_logps_and_entropies",
        lambda m, ids, *a, **k: rows.append(ids.shape[0]) or real(m, ids, *a, **k),
    )
    rewards = [0, 0, 0, 0, 0, 1, 2, 3, 1, 1, 1, 1, 0, 5, 0, 5]  # stds: 0, 1.29, 0, 2.89 -> keep groups 1 and 3
    batch = _batch(trainer, monkeypatch, rewards)
    assert rows == [8] and "old_per_token_logps" in batch
    kept = torch.tensor([0, 1, 2, 3, 0, 5, 0, 5], dtype=torch.float32)
    grouped = kept.view(2, 4)
    expected = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    assert torch.allclose(batch["advantages"], expected, atol=1e-6)


def test_ratio_one_matches_plain_group_normalised_grpo(tmp_path, tiny_tokenizer, fresh_model, monkeypatch):
    trainer = MultiTurnStarPOTrainer(
        fresh_model, make_args(tmp_path, rollout_filter_ratio=1.0), processing_class=tiny_tokenizer
    )
    rewards = torch.tensor([0, 0, 0, 0, 0, 1, 2, 3, 1, 1, 1, 1, 0, 5, 0, 5], dtype=torch.float32)
    batch = _batch(trainer, monkeypatch, rewards.tolist())
    grouped = rewards.view(4, 4)
    # TRL's formula: (r - group mean) / (group std + 1e-4)
    expected = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    assert batch["completion_ids"].shape[0] == 16
    assert torch.allclose(batch["advantages"], expected, atol=1e-6)


def test_env_tokens_and_padding_never_reach_the_loss(tmp_path, tiny_tokenizer, fresh_model):
    args = make_args(tmp_path, env_id="starpo/Sokoban-v0", max_turns=3, rollout_filter_ratio=1.0)
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions([{"seed": s} for s in range(4) for _ in range(4)])
    batch = {k: v for k, v in batch.items()}
    mask = batch["completion_mask"] * batch["tool_mask"]
    assert (batch["tool_mask"] == 0).any() and (batch["completion_mask"] == 0).any()  # env tokens and padding exist
    T = batch["completion_ids"].shape[1]
    batch["advantages"] = torch.linspace(-1, 1, 16)[:, None].expand(16, T).clone()
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop otherwise
    loss = trainer._compute_loss(trainer.model, batch)
    altered = dict(batch)
    outside = mask == 0
    altered["advantages"] = batch["advantages"].masked_fill(outside, 1e6)
    altered["old_per_token_logps"] = torch.zeros_like(batch["sampling_per_token_logps"]).masked_fill(outside, -50.0)
    base_old = dict(batch)
    base_old["old_per_token_logps"] = torch.zeros_like(batch["sampling_per_token_logps"])
    loss_base = trainer._compute_loss(trainer.model, base_old)
    loss_altered = trainer._compute_loss(trainer.model, altered)
    assert torch.isfinite(loss) and torch.allclose(loss_base, loss_altered, atol=1e-7)


def test_trainer_refuses_a_config_without_env(tmp_path, tiny_tokenizer, fresh_model):
    with pytest.raises(ValueError, match="env_id"):
        MultiTurnStarPOTrainer(fresh_model, make_args(tmp_path, env_id=None), processing_class=tiny_tokenizer)


def test_held_out_evaluation_plays_in_calls_of_eval_rollout_batch_size(tmp_path, tiny_tokenizer, fresh_model):
    from conftest import ScriptedBackend

    backend = ScriptedBackend(tiny_tokenizer, "<think>x</think><answer>Dragon</answer>", tiny_tokenizer.eos_token_id)
    args = make_args(tmp_path, num_eval_episodes=8, eval_rollout_batch_size=3)
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer, backend=backend)
    metrics = trainer.evaluate_success()
    assert backend.calls == [3, 3, 2]  # max_turns=1: one generation call per engine call
    seeds = [ep.start.seed for ep in trainer.last_eval_episodes]
    assert seeds == list(range(args.eval_seed_offset, args.eval_seed_offset + 8)) and metrics["turns"] == 1.0
    with pytest.raises(ValueError, match="eval_rollout_batch_size"):
        make_args(tmp_path, eval_rollout_batch_size=0)


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_a_varying_kept_count_is_padded_with_rows_that_hold_no_model_token(
    tmp_path, tiny_tokenizer, fresh_model, estimator
):
    """4 start states x 2; one micro-batch of 2 rows per process step (steps_per_generation 4). Step 1: only
    group 1 mixes a malformed reply with a valid one (the others' rewards are constant: variance 0), so
    top_p with include_zero=False keeps that group alone: 2 rows, padded to 4 with rows whose loss mask is
    zero, advantage zero, and which add nothing to the batch's token count. Steps 2-3: every reply is
    malformed, the filter keeps nothing; the step is skipped, and two in a row stop training, naming the filter."""
    from conftest import ScriptedBackend

    def replies(call, i):
        return "<think>x</think><answer>Dragon</answer>" if call == 0 and i == 3 else "no format"

    backend = ScriptedBackend(tiny_tokenizer, replies, tiny_tokenizer.eos_token_id)
    args = make_args(
        tmp_path,
        num_generations=2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        rollout_filter_strategy="top_p",
        rollout_filter_ratio=1.0,
        rollout_filter_metric="reward_variance",
        rollout_filter_include_zero=False,
        max_steps=3,
        rollout_filter_empty_stop_steps=2,
        advantage_estimator=estimator,
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer, backend=backend)
    batches = []
    step = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(step(inputs)) or batches[-1]
    with pytest.raises(TrainingStopped, match="rollout filter kept no group 2 steps in a row"):
        trainer.train()
    assert [h["kept"] for h in trainer.kept_group_history] == [[1], [], []]
    first = batches[0]
    mask = first["completion_mask"] * first["tool_mask"]
    assert len(first["completion_ids"]) == 4 and mask[2:].sum() == 0 and mask[:2].sum() > 0
    assert first["advantages"][2:].abs().sum() == 0 and first["advantages"][:2].abs().sum() > 0
    assert int(first["num_items_in_batch"]) == int(mask[:2].sum())
    assert int(batches[1]["num_items_in_batch"]) == 0
    logged = [
        row["rollout/empty_after_filter"] for row in trainer.state.log_history if "rollout/empty_after_filter" in row
    ]
    assert logged and logged[0] == 0.0


@pytest.mark.parametrize("warmup", [0, 2])
def test_critic_warmup_steps_train_only_the_critic(tmp_path, tiny_tokenizer, scripted, warmup):
    """With `critic_warmup_steps: 2` and 2 steps the critic learns and no policy weight moves (the entropy
    bonus included: the policy loss is zeroed); with 0 the same run moves the policy."""
    from starpo_trl.tiny import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, seed=3, hidden_size=32, num_layers=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    args = make_args(
        tmp_path,
        advantage_estimator="gae",
        critic_warmup_steps=warmup,
        critic_learning_rate=3e-3,
        entropy_coef=0.05,
        weight_decay=0.0,
        rollout_filter_ratio=1.0,
        max_steps=2,
    )
    trainer = MultiTurnStarPOTrainer(
        model, args, processing_class=tiny_tokenizer, backend=scripted("<think>x</think><answer>Dragon</answer>")
    )
    critic_before = [p.detach().clone() for p in trainer.critic.trainable_parameters()]
    trainer.train()
    moved = not all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert moved == (warmup == 0)
    assert any(not torch.equal(a, b) for a, b in zip(critic_before, trainer.critic.trainable_parameters()))


def test_each_micro_batch_is_trained_at_its_own_width_with_the_same_loss_and_gradients(
    tmp_path, tiny_tokenizer, fresh_model, monkeypatch
):
    """TRL pads every micro-batch to the whole batch's longest completion; compute_loss cuts the columns that
    are padding in every row of its micro-batch before TRL's loss. The loss and every gradient are those of the
    uncut micro-batch (to float rounding: the kernels see other shapes), and TRL's loss sees the cut width."""
    from trl import GRPOTrainer

    args = make_args(tmp_path, env_id="starpo/Sokoban-v0", max_turns=3, rollout_filter_ratio=1.0)
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions([{"seed": s} for s in range(4) for _ in range(4)])
    width = batch["completion_ids"].shape[1]
    micro = {k: v[:4].clone() if torch.is_tensor(v) and v.dim() else v for k, v in batch.items()}
    for r, n in enumerate([width // 2, width // 3, width // 2 - 3, 5]):  # episodes shorter than the batch's longest
        micro["completion_mask"][r, n:] = 0
        micro["tool_mask"][r, n:] = 0
        micro["completion_ids"][r, n:] = tiny_tokenizer.pad_token_id
    micro["tool_mask"][0, width // 2 - 1] = 1  # the last kept column holds a model token: cutting it would show
    micro["advantages"] = torch.linspace(-1, 1, 4 * width).view(4, width)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    seen = []
    original = GRPOTrainer._compute_loss
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", lambda self, m, i: seen.append(i) or original(self, m, i))

    def loss_and_grads(fn):
        trainer.model.zero_grad()
        loss = fn(trainer.model, micro)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]

    cut_loss, cut_grads = loss_and_grads(trainer.compute_loss)
    assert seen[-1]["completion_ids"].shape[1] == width // 2 < width and seen[-1]["advantages"].shape[1] == width // 2
    full_loss, full_grads = loss_and_grads(trainer._compute_loss)
    assert seen[-1]["completion_ids"].shape[1] == width
    assert torch.allclose(cut_loss, full_loss, rtol=1e-5, atol=1e-9), (cut_loss, full_loss)
    for cut, full in zip(cut_grads, full_grads, strict=True):
        assert torch.allclose(cut, full, rtol=1e-4, atol=1e-9)
