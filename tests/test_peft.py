"""LoRA through the trainer: only the adapter trains, the reference is the base (adapter disabled), LoRA critic."""

import torch
from helpers import make_args
from peft import LoraConfig

from starpo_trl import MultiTurnStarPOTrainer
from starpo_trl.tiny import build_tiny_model

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def test_lora_trains_only_the_adapter_and_the_reference_is_the_base(tmp_path, tiny_tokenizer, fresh_model):
    args = make_args(tmp_path, beta=0.04, learning_rate=5e-2, max_steps=2, rollout_filter_ratio=1.0)
    trainer = MultiTurnStarPOTrainer(
        fresh_model, args, processing_class=tiny_tokenizer, peft_config=LoraConfig(**LORA)
    )
    assert trainer.ref_model is None  # no second copy: the reference is the base with the adapter off
    base = build_tiny_model(tiny_tokenizer, seed=1)  # the same weights fresh_model started from
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all("lora_" in n for n in changed)
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions([{"seed": s} for s in range(4) for _ in range(4)])
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    T = batch["completion_ids"].shape[1]
    with torch.no_grad():
        logits = base(input_ids=ids, attention_mask=mask).logits[:, -T - 1 : -1] / args.temperature
    base_logps = torch.log_softmax(logits.float(), -1).gather(-1, batch["completion_ids"][..., None]).squeeze(-1)
    model_tokens = (batch["completion_mask"] * batch["tool_mask"]).bool()
    assert torch.allclose(batch["ref_per_token_logps"][model_tokens], base_logps[model_tokens], atol=1e-4)
    policy_logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, T, batch_size=4)
    assert not torch.allclose(policy_logps[model_tokens], base_logps[model_tokens], atol=1e-4)  # the adapter matters


def test_lora_critic_trains_its_own_adapter_on_the_shared_base(tmp_path, tiny_tokenizer, fresh_model):
    args = make_args(
        tmp_path,
        advantage_estimator="gae",
        critic_type="lora",
        critic_learning_rate=1e-2,
        max_steps=2,
        rollout_filter_ratio=1.0,
    )
    trainer = MultiTurnStarPOTrainer(
        fresh_model, args, processing_class=tiny_tokenizer, peft_config=LoraConfig(**LORA)
    )
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert any(".critic." in n for n in changed)  # the value adapter trained
    assert all("lora_" in n for n in changed)  # the shared base did not move
    assert trainer.model.active_adapter == "default"
    assert any(k.startswith("critic/") for row in trainer.state.log_history for k in row)

    # after a warm start the policy is saved merged (train.save_merged_policy): the very function it computes,
    # without the critic's adapter; the critic keeps its own saved copy
    from transformers import AutoModelForCausalLM

    import train

    ids = torch.tensor([tiny_tokenizer("<answer> Dragon </answer>")["input_ids"]])
    with torch.no_grad():
        policy_logits = trainer.model(input_ids=ids).logits
        with trainer.model.disable_adapter():
            assert not torch.allclose(trainer.model(input_ids=ids).logits, policy_logits, atol=1e-5)  # it trained
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    train.save_merged_policy(trainer, str(out))
    assert (out / "value_model").is_dir() and not (out / "adapter_config.json").exists()
    saved = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in n for n, _ in saved.named_parameters())
    with torch.no_grad():
        assert torch.allclose(saved(input_ids=ids).logits, policy_logits, atol=1e-5)
