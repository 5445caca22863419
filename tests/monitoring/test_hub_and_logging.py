"""Model card, local save/load, trackio and wandb (offline), the sample-episode table."""

import glob
import os

import pandas as pd
import torch
from helpers import make_args
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer

from starpo_trl import MultiTurnStarPOTrainer
from starpo_trl.monitoring.model_card import evaluation_table


def test_evaluation_table_by_hand():
    table = evaluation_table(
        {"before RL": {"success": 0.25, "turns": 3.0}, "after RL": {"success": 0.5, "turns": 2.5, "pass@4": 1.0}}
    )
    assert table.splitlines() == [
        "| metric | before RL | after RL |",
        "|---|---|---|",
        "| success | 0.25 | 0.5 |",
        "| turns | 3 | 2.5 |",
        "| pass@4 |  | 1 |",
    ]


def test_model_card_renders_and_the_model_round_trips(tmp_path, tiny_tokenizer, fresh_model):
    args = make_args(
        tmp_path, env_id="starpo/FrozenLake-v0", env_kwargs='{"is_slippery": false}', rollout_filter_ratio=0.5
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    trainer.evaluation_results = {
        "before RL": {"success": 0.125},
        "after RL": {"success": 0.375, "valid_action_rate": 0.9},
    }
    trainer.recipe = "model_name_or_path: tiny\nenv_id: starpo/FrozenLake-v0\n"
    trainer.save_model(str(tmp_path))
    trainer.create_model_card()
    card = ModelCard.load(str(tmp_path / "README.md"))
    assert {"starpo-trl", "trl", "FrozenLake-v0"} <= set(card.data.tags)
    assert card.data.base_model is None  # a local/tiny model is not linked as a Hub base model
    text = card.text
    assert "| success | 0.125 | 0.375 |" in text and "| valid_action_rate |  | 0.9 |" in text
    assert "`starpo/FrozenLake-v0`, kwargs `{'is_slippery': False}`" in text
    assert "| rollout filter: value (top_k share, top_k_abs count, top_p p, min_p fraction) | `0.5` |" in text
    assert "| no update when every advantage is 0 | `False` |" in text
    assert "env_id: starpo/FrozenLake-v0" in text  # the recipe
    # saved model and tokenizer load back bit-identical, with the same tokenisation
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), loaded.named_parameters()):
        assert torch.equal(a, b), name
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    sample = "<think>go</think><answer>Left || Up</answer>"
    assert tok(sample)["input_ids"] == tiny_tokenizer(sample)["input_ids"]
    assert tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    ) == tiny_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_trackio_and_wandb_offline_get_metrics_and_the_episode_table(
    tmp_path, tiny_tokenizer, fresh_model, monkeypatch
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    os.makedirs(tmp_path / "wandb")
    from trackio import sqlite_storage

    monkeypatch.setattr(sqlite_storage, "TRACKIO_DIR", tmp_path / "trackio")  # local-first: a database file, no server
    args = make_args(
        tmp_path / "out",
        env_id="starpo/Sokoban-v0",
        max_turns=2,
        report_to=["trackio", "wandb"],
        log_completions=True,
        num_sample_episodes=3,
        project="starpo-test",
        run_name="t",
    )
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer)
    trainer.train()
    import wandb

    wandb.finish()
    assert glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*" / "*.wandb"))
    assert glob.glob(str(tmp_path / "trackio" / "starpo-test.db"))
    logs = sqlite_storage.SQLiteStorage.get_logs("starpo-test", "t")
    assert any("train/env/Sokoban-v0/success" in row for row in logs)
    tables = sorted(glob.glob(str(tmp_path / "out" / "completions" / "*.parquet")))
    assert tables
    df = pd.read_parquet(tables[0])
    assert len(df) == 3 and {"seed", "success", "turns", "advantage", "env"} <= set(df.columns)
    assert df["completion"].str.contains(r"\[assistant\]").all()  # the whole conversation, turn by turn
