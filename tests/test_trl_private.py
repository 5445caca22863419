"""The TRL / transformers internals the trainer relies on still exist (starpo_trl/trl_private.py),
and the trainer reaches for no private name of its parents beyond that list."""

import inspect
import re

from helpers import make_args
from trl import GRPOTrainer

from starpo_trl import MultiTurnStarPOTrainer, trl_private


def test_overridden_and_called_methods_exist_in_trl():
    for name in trl_private.OVERRIDDEN_METHODS + trl_private.CALLED_METHODS:
        assert callable(getattr(GRPOTrainer, name, None)), (
            f"GRPOTrainer.{name} is gone: TRL renamed it; update the trainer"
        )
    for name in trl_private.OVERRIDDEN_METHODS:  # ours really overrides it
        assert name in vars(MultiTurnStarPOTrainer), name


def test_attributes_exist_on_a_built_trainer(tmp_path, tiny_tokenizer, fresh_model):
    trainer = MultiTurnStarPOTrainer(fresh_model, make_args(tmp_path), processing_class=tiny_tokenizer)
    missing = [n for n in trl_private.ATTRIBUTES if not hasattr(trainer, n)]
    assert not missing, f"GRPOTrainer no longer sets {missing}: TRL renamed them; update the trainer"
    grpo_source = inspect.getsource(GRPOTrainer)
    for name in trl_private.VLLM_ATTRIBUTES:  # set only with vLLM: checked in TRL's source
        assert f"self.{name} =" in grpo_source, (
            f"GRPOTrainer no longer sets {name} (vLLM): TRL renamed it; update the trainer"
        )


def test_the_trainer_uses_no_other_private_parent_name():
    source = inspect.getsource(inspect.getmodule(MultiTurnStarPOTrainer))
    used = set(re.findall(r"(?:self|super\(\))\.(_[A-Za-z]\w*)", source))
    ours = {n for n in vars(MultiTurnStarPOTrainer)} | set(re.findall(r"self\.(_[A-Za-z]\w*)\s*[:=]", source))
    allowed = set(
        trl_private.OVERRIDDEN_METHODS
        + trl_private.CALLED_METHODS
        + trl_private.ATTRIBUTES
        + trl_private.VLLM_ATTRIBUTES
    )
    unlisted = sorted(used - ours - allowed)
    assert not unlisted, f"add these parent internals to starpo_trl/trl_private.py: {unlisted}"


def test_vllm_generation_internals_the_weight_sync_uses_exist():
    from trl.generation.vllm_generation import VLLMGeneration

    assert callable(getattr(VLLMGeneration, "_iter_named_params", None)), "VLLMGeneration._iter_named_params is gone"
    source = inspect.getsource(VLLMGeneration)
    for name in trl_private.VLLM_GENERATION_NAMES[1:]:
        assert f"self.{name} =" in source, f"VLLMGeneration no longer sets {name}: update rollout/vllm_backend.py"
