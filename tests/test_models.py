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


def test_a_template_without_tool_calls_is_refused_before_the_weights_load(tmp_path, monkeypatch):
    """The tool-call template check ran after the weights loaded (38 s for SmolLM2); now the tokenizer alone
    decides, before any weight is read, in the library call and in train.py (#45, item 8)."""
    import pytest

    import starpo_trl.models as models
    import train
    from starpo_trl.rollout import RolloutConfig

    tokenizer = build_tiny_tokenizer()  # its template renders no tool calls
    build_tiny_model(tokenizer, seed=3).save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were loaded before the template was checked")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", no_weights)
    model_args = ModelConfig(model_name_or_path=str(tmp_path / "policy"), dtype="float32")
    with pytest.raises(ValueError, match="needs a chat template that renders tool calls"):
        load_model_and_tokenizer(model_args, rollout=RolloutConfig(action_format="tool_call"))
    with pytest.raises(ValueError, match="needs a chat template that renders tool calls"):
        train.cli(
            [
                "--model_name_or_path",
                str(tmp_path / "policy"),
                "--env_id",
                "starpo/Bandit-v0",
                "--action_format",
                "tool_call",
                "--output_dir",
                str(tmp_path / "out"),
                "--use_cpu",
                "true",
            ]
        )
