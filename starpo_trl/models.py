"""Loading the policy and tokenizer: a Hub / local checkpoint, or the offline tiny model."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


@dataclass
class TinyModelArguments:
    tiny_hidden_size: int = field(
        default=128, metadata={"help": "Hidden size of the offline tiny model (model_name_or_path=tiny)."}
    )
    tiny_num_layers: int = field(default=4, metadata={"help": "Layers of the offline tiny model."})


def load_model_and_tokenizer(
    model_args,
    tiny_args: TinyModelArguments | None = None,
    seed: int = 0,
    trust_remote_code: bool = False,
    rollout=None,
):
    """``model_args`` is TRL's ``ModelConfig``; ``model_name_or_path="tiny"`` builds the offline tiny model.

    The tokenizer loads first and its chat template is checked before the weights load: against
    ``rollout`` (a ``RolloutConfig``: reply prefix, tool calls) when given, else the default episode settings."""
    name = model_args.model_name_or_path
    if name is None:
        raise ValueError(
            "Set model_name_or_path (a Hub id such as Qwen/Qwen2.5-0.5B-Instruct, a local directory, or 'tiny')."
        )
    if name.startswith("~"):  # a home-relative directory, e.g. the offline model `make model` writes
        name = os.path.expanduser(name)
    if name == "tiny":
        from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer

        tiny_args = tiny_args or TinyModelArguments()
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(
            tokenizer, seed=seed, hidden_size=tiny_args.tiny_hidden_size, num_layers=tiny_args.tiny_num_layers
        )
        return model, tokenizer
    tokenizer = AutoTokenizer.from_pretrained(
        name, revision=model_args.model_revision, trust_remote_code=trust_remote_code
    )
    check_chat_template(tokenizer, name, model_args, rollout)  # before the (large) weights load
    dtype = model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype)
    kwargs = dict(revision=model_args.model_revision, trust_remote_code=trust_remote_code, dtype=dtype)
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    from trl import get_quantization_config

    quantization = get_quantization_config(model_args)
    if quantization is not None:
        from trl import get_kbit_device_map

        kwargs.update(quantization_config=quantization, device_map=get_kbit_device_map())
    model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    return model, tokenizer


def eos_token_ids(tokenizer, generation_eos=None) -> list[int]:
    """Every id that ends a turn: the tokenizer's eos first, then the generation config's (int or list)."""
    extra = generation_eos if isinstance(generation_eos, list) else [generation_eos]
    return [tokenizer.eos_token_id] + [e for e in extra if e is not None and e != tokenizer.eos_token_id]


def check_chat_template(tokenizer, name: str, model_args, rollout=None) -> None:
    """Refuse a chat template the episode engine cannot use with ``rollout``'s settings (a ``RolloutConfig``;
    default settings when None): see ``check_tokenizer``."""
    from transformers import GenerationConfig

    from starpo_trl.rollout import RolloutConfig
    from starpo_trl.rollout.engine import check_tokenizer

    try:
        generation_eos = GenerationConfig.from_pretrained(name, revision=model_args.model_revision).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's eos is all there is
        generation_eos = None
    check_tokenizer(tokenizer, eos_token_ids(tokenizer, generation_eos), rollout or RolloutConfig())


def weights_digest(model) -> str:
    """SHA-256 of every parameter's bytes, in name order: equal digests mean bit-identical weights.

    ``model`` is a module, or a list of tensors (hashed in list order). DeepSpeed ZeRO-3 and FSDP
    parameters are gathered first, so every process must call it then."""
    import hashlib
    from contextlib import nullcontext

    named = (
        sorted(model.named_parameters())
        if hasattr(model, "named_parameters")
        else [(f"{i:05d}", p) for i, p in enumerate(model)]
    )
    gather = nullcontext()
    if any(hasattr(p, "ds_id") for _, p in named):
        import deepspeed

        gather = deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None)
    digest = hashlib.sha256()
    with gather:
        for name, param in named:
            whole = param.full_tensor() if hasattr(param, "full_tensor") else param  # FSDP's DTensor: all shards
            digest.update(name.encode())
            digest.update(whole.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
