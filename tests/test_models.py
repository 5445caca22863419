"""Loading the policy: a home-relative model directory (the offline model `make model` writes) loads from
the library API as from train.py."""

from trl import ModelConfig

from starpo_trl.models import load_model_and_tokenizer, weights_digest
from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer


def test_a_home_relative_model_directory_is_expanded(tmp_path, monkeypatch):
    tokenizer = build_tiny_tokenizer()
    saved = build_tiny_model(tokenizer, seed=3)
    saved.save_pretrained(tmp_path / "models" / "policy")
    tokenizer.save_pretrained(tmp_path / "models" / "policy")
    monkeypatch.setenv("HOME", str(tmp_path))
    model, loaded_tokenizer = load_model_and_tokenizer(
        ModelConfig(model_name_or_path="~/models/policy", dtype="float32")
    )
    assert weights_digest(model) == weights_digest(saved)
    assert loaded_tokenizer.encode("hello world") == tokenizer.encode("hello world")
