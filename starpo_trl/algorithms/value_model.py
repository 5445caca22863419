"""The critic's network and its loss: a value head on a copy of the policy's decoder, or on a LoRA
value adapter beside the policy's own.

``ValueModel`` predicts, for every completion position ``t``, the value of the state before token
``t`` (the decoder's hidden state at position ``t - 1`` through a linear value head). It is
initialised from the policy's weights:

- ``critic_type="full"``: a deep copy of the policy's decoder (no LM head) plus a value head; or of
  another model's decoder (``init_from``: e.g. the policy before a warm start, or a reward model).
- ``critic_type="lora"`` (policy trained with PEFT): a second LoRA adapter named ``critic`` on the
  policy's own frozen base, plus a value head. The base weights are shared, so a single-GPU LoRA
  run pays only for the adapter, the head and their optimizer state.

How the network is held and trained (one process, DDP, DeepSpeed, FSDP2) is ``starpo_trl.algorithms.critic``.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
from torch import nn

CRITIC_ADAPTER = "critic"


def decoder_of(model):
    """The transformer body of a causal LM (``model.model`` for Qwen/Llama), without its LM head."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(model, model.base_model_prefix)


def is_partitioned(params) -> bool:
    """True for DeepSpeed ZeRO-3 parameters (each process holds only a shard)."""
    return any(hasattr(p, "ds_id") for p in params)


def _copy_decoder(decoder) -> nn.Module:
    """A full, independent copy of ``decoder``; one that ZeRO-3 partitioned (loaded under
    ``zero3_init_flag``) is gathered first and rebuilt from its config and weights."""
    if not is_partitioned(decoder.parameters()):
        return copy.deepcopy(decoder)
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(decoder.parameters()), modifier_rank=None):
        state = {k: v.detach().clone() for k, v in decoder.state_dict().items()}
    copied = type(decoder)(decoder.config)
    copied.load_state_dict(state)
    return copied.to(next(iter(state.values())).dtype)


class ValueModel(nn.Module):
    def __init__(self, policy, critic_type: str = "full", init_from=None):
        super().__init__()
        if critic_type not in ("full", "lora"):
            raise ValueError(f"critic_type must be 'full' or 'lora', got {critic_type!r}")
        if init_from is not None and critic_type != "full":
            raise ValueError(
                "A separate value model (value_model) needs critic_type='full': the LoRA critic shares the policy's base."
            )
        self.critic_type = critic_type
        source = policy if init_from is None else init_from  # any causal LM with the policy's tokenizer
        hidden = source.config.get_text_config().hidden_size
        self.layer_classes = list(getattr(source, "_no_split_modules", None) or [])  # what FSDP wraps one by one
        if critic_type == "full":
            self.backbone = _copy_decoder(decoder_of(source))
            self.backbone.requires_grad_(True)
            self.policy = None
        else:
            if not hasattr(policy, "peft_config"):
                raise ValueError(
                    "critic_type='lora' needs a PEFT policy: train with a peft_config (use_peft=True), or use critic_type='full'."
                )
            policy.add_adapter(CRITIC_ADAPTER, copy.deepcopy(policy.peft_config["default"]))
            policy.set_adapter("default")
            self.backbone = None
            self.policy = [policy]  # a list keeps the policy out of this module's parameters
        ref = next(policy.parameters())
        if self.backbone is not None:
            self.backbone.to(ref.device)
        self.head = nn.Linear(hidden, 1, device=ref.device, dtype=torch.float32)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def trainable_parameters(self) -> list[nn.Parameter]:
        params = list(self.head.parameters())
        if self.backbone is not None:
            return list(self.backbone.parameters()) + params
        policy = self.policy[0]
        return [p for n, p in policy.named_parameters() if f".{CRITIC_ADAPTER}." in n] + params

    def parameter_names(self) -> list[str]:
        """This module's names of ``trainable_parameters()`` (the LoRA critic's adapter is the policy's: not named here)."""
        names = {id(p): n for n, p in self.named_parameters()}
        return [names[id(p)] for p in self.trainable_parameters()]

    @contextmanager
    def active(self):
        """For the LoRA critic: the ``critic`` adapter is active (and trainable) inside, ``default`` after."""
        if self.policy is None:
            yield
            return
        policy = self.policy[0]
        policy.set_adapter(CRITIC_ADAPTER)
        try:
            yield
        finally:
            policy.set_adapter("default")

    def forward(self, input_ids, attention_mask, logits_to_keep: int) -> torch.Tensor:
        """Values at the completion positions. (B, L) -> (B, logits_to_keep), float32. Call inside ``active()``."""
        decoder = self.backbone if self.backbone is not None else decoder_of(self.policy[0])
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[
            :, -logits_to_keep - 1 : -1
        ]
        # float32 head (DeepSpeed casts it to the run's precision: the values are returned as float32)
        return self.head(hidden.to(self.head.weight.dtype)).float().squeeze(-1)


def value_loss(values, old_values, returns, mask, clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss over model tokens: ``0.5 * mean(max((v - R)^2, (v_clipped - R)^2))``
    with ``v_clipped = clamp(v, v_old - clip, v_old + clip)``; and the share of tokens where the
    clipped term was larger. Inside the range ``v_clipped`` is ``v`` itself (``v_old + (v - v_old)``
    can round away from ``v`` and count an unclipped token as clipped). All (B, T); returns two scalars."""
    m = mask.float()
    n = m.sum().clamp(min=1.0)
    loss_unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * (loss_unclipped * m).sum() / n, torch.zeros((), device=values.device)
    clipped = torch.clamp(values, old_values - clip, old_values + clip)
    loss_clipped = (clipped - returns) ** 2
    losses = torch.max(loss_unclipped, loss_clipped)
    clipfrac = ((loss_clipped > loss_unclipped).float() * m).sum() / n
    return 0.5 * (losses * m).sum() / n, clipfrac


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns), over model tokens only."""
    m = mask.bool()
    v, r = values[m].float(), returns[m].float()
    if r.numel() < 2:
        return float("nan")
    var = r.var()
    return float("nan") if var == 0 else float(1 - (r - v).var() / var)
