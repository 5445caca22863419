"""The value model for the PPO / GAE path: a full copy of the policy, or a LoRA value adapter.

``Critic`` predicts, for every completion position ``t``, the value of the state before token ``t``
(the decoder's hidden state at position ``t - 1`` through a linear value head). It has its own
AdamW optimizer, learning rate and value clipping, and is initialised from the policy's weights:

- ``critic_type="full"``: a deep copy of the policy's decoder (no LM head) plus a value head; or of
  another model's decoder (``init_from``: e.g. the policy before a warm start, or a reward model).
- ``critic_type="lora"`` (policy trained with PEFT): a second LoRA adapter named ``critic`` on the
  policy's own frozen base, plus a value head. The base weights are shared, so a single-GPU LoRA
  run pays only for the adapter, the head and their optimizer state.

With several processes the critic's gradients are averaged across them and its AdamW state is
sharded (ZeRO stage 1, torch's ``ZeroRedundancyOptimizer``): each process keeps the moments of its
share of the parameters, steps that share and broadcasts it, so every process ends each step with
the same critic weights (all start from process 0's). ``save`` gathers the shards into one
optimizer file.

Under DeepSpeed (``deepspeed_config``, full critic) the critic is sharded like the policy: it gets
its own DeepSpeed engine with the policy's ZeRO stage, offload and precision (ZeRO-2: gradients and
optimizer state sharded; ZeRO-3: weights too), its own AdamW and learning rate, and one optimizer
step per micro-batch. ``save`` then writes the gathered weights plus DeepSpeed's sharded checkpoint
(``engine/``), which ``load`` restores on the same number of processes.

Under FSDP2 (``fsdp_accelerator``, full critic) Accelerate shards the critic exactly as it shards
the policy (``fsdp2_prepare_model``: same wrap policy, offload and mixed precision); weights,
gradients and AdamW state are sharded, gradients averaged by FSDP. ``save`` gathers weights and
optimizer state into the same files as an unsharded critic, so either resumes the other.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

CRITIC_ADAPTER = "critic"


ENGINE_TAG = "engine"  # DeepSpeed checkpoint folder inside the critic's directory


def _decoder(model):
    """The transformer body of a causal LM (``model.model`` for Qwen/Llama), without its LM head."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(model, model.base_model_prefix)


def _is_partitioned(params) -> bool:
    """True for DeepSpeed ZeRO-3 parameters (each process holds only a shard)."""
    return any(hasattr(p, "ds_id") for p in params)


def _copy_decoder(decoder) -> nn.Module:
    """A full, independent copy of ``decoder``; one that ZeRO-3 partitioned (loaded under
    ``zero3_init_flag``) is gathered first and rebuilt from its config and weights."""
    if not _is_partitioned(decoder.parameters()):
        return copy.deepcopy(decoder)
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(decoder.parameters()), modifier_rank=None):
        state = {k: v.detach().clone() for k, v in decoder.state_dict().items()}
    copied = type(decoder)(decoder.config)
    copied.load_state_dict(state)
    return copied.to(next(iter(state.values())).dtype)


def deepspeed_critic_config(
    policy_config: dict, micro_batch_size: int, max_grad_norm: float, bf16: bool, fp16: bool
) -> dict:
    """The critic engine's DeepSpeed config: the policy's ZeRO stage and offload settings (unresolved
    ``"auto"`` entries dropped), the run's precision, the trainer's gradient clipping, and one optimizer
    step per micro-batch with the critic's own (torch) AdamW."""

    def resolved(d):
        return {k: resolved(v) if isinstance(v, dict) else v for k, v in d.items() if v != "auto"}

    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": max_grad_norm,
        "zero_optimization": resolved(policy_config.get("zero_optimization", {})),
        "zero_allow_untested_optimizer": True,  # torch's AdamW, with the critic's learning rate
        "zero_force_ds_cpu_optimizer": False,  # also with the optimizer offloaded to the CPU
        "bf16": {"enabled": bool(bf16)},
        "fp16": {"enabled": bool(fp16)},
        "steps_per_print": 2**31 - 1,
    }


class Critic(nn.Module):
    def __init__(
        self,
        policy,
        critic_type: str = "full",
        learning_rate: float = 1e-5,
        value_clip: float | None = 0.5,
        weight_decay: float = 0.01,
        shard_optimizer: bool | None = None,
        init_from=None,
        deepspeed_config: dict | None = None,
        fsdp_accelerator=None,
    ):
        super().__init__()
        if critic_type not in ("full", "lora"):
            raise ValueError(f"critic_type must be 'full' or 'lora', got {critic_type!r}")
        self.critic_type = critic_type
        self.value_clip = value_clip
        if init_from is not None and critic_type != "full":
            raise ValueError(
                "A separate value model (value_model) needs critic_type='full': the LoRA critic shares the policy's base."
            )
        source = policy if init_from is None else init_from  # any causal LM with the policy's tokenizer
        hidden = source.config.get_text_config().hidden_size
        if (deepspeed_config is not None or fsdp_accelerator is not None) and critic_type != "full":
            raise ValueError(
                "A sharded critic needs critic_type='full': the LoRA critic's adapter lives in the policy."
            )
        if critic_type == "full":
            self.backbone = _copy_decoder(_decoder(source))
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
        self._engine = ()  # a tuple keeps the engine (which holds this module) out of its submodules
        self.fsdp = fsdp_accelerator is not None
        self.sharded = False  # ZeRO-1 optimizer (DDP)
        if self.fsdp:
            self.optimizer = self._shard_with_fsdp(fsdp_accelerator, source, learning_rate, weight_decay)
        elif deepspeed_config is not None:
            self.optimizer = self._shard_with_deepspeed(deepspeed_config, learning_rate, weight_decay)
        else:
            self.optimizer = self._replicated_optimizer(shard_optimizer, learning_rate, weight_decay)

    def _shard_with_fsdp(self, accelerator, source, learning_rate, weight_decay):
        """Accelerate shards this module as it shards the policy; AdamW then runs over the shards."""
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        if accelerator.state.fsdp_plugin.fsdp_version != 2:
            raise ValueError("The critic is sharded with FSDP2 only: set fsdp_version: 2 in the accelerate config.")
        self._no_split_modules = list(getattr(source, "_no_split_modules", None) or [])  # the layers to wrap
        fsdp2_prepare_model(accelerator, self)  # in place; process 0's weights everywhere
        return torch.optim.AdamW(self.trainable_parameters(), lr=learning_rate, weight_decay=weight_decay)

    def _shard_with_deepspeed(self, config, learning_rate, weight_decay):
        """A DeepSpeed engine of its own; ``deepspeed.initialize`` broadcasts process 0's weights, then shards."""
        import deepspeed

        optimizer = torch.optim.AdamW(self.trainable_parameters(), lr=learning_rate, weight_decay=weight_decay)
        engine, optimizer, _, _ = deepspeed.initialize(model=self, optimizer=optimizer, config=config)
        self._engine = (engine,)
        return optimizer

    def _replicated_optimizer(self, shard_optimizer, learning_rate, weight_decay):
        """Weights on every process; AdamW state sharded (ZeRO-1) when several processes train together."""
        if shard_optimizer is None:
            shard_optimizer = (
                torch.distributed.is_available()
                and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() > 1
            )
        if not shard_optimizer:
            return torch.optim.AdamW(self.trainable_parameters(), lr=learning_rate, weight_decay=weight_decay)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.sharded = True
        # every process starts from process 0's critic (a LoRA adapter's random init differs per process)
        with torch.no_grad():
            for p in self.trainable_parameters():
                torch.distributed.broadcast(p.data, src=0)
        return ZeroRedundancyOptimizer(
            self.trainable_parameters(), optimizer_class=torch.optim.AdamW, lr=learning_rate, weight_decay=weight_decay
        )

    @property
    def engine(self):
        """The critic's DeepSpeed engine, or None."""
        return self._engine[0] if self._engine else None

    def full_parameters(self) -> list[torch.Tensor]:
        """Whole copies of ``trainable_parameters()``, also when ZeRO-3 or FSDP shard them (collective then)."""
        with self.gathered():
            return [
                p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
                for p in self.trainable_parameters()
            ]

    def gathered(self):
        """Inside, ``trainable_parameters()`` hold their full values under ZeRO-3 (read-only)."""
        params = self.trainable_parameters()
        if not _is_partitioned(params):
            return nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)

    def trainable_parameters(self) -> list[nn.Parameter]:
        params = list(self.head.parameters())
        if self.backbone is not None:
            return list(self.backbone.parameters()) + params
        policy = self.policy[0]
        return [p for n, p in policy.named_parameters() if f".{CRITIC_ADAPTER}." in n] + params

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
        decoder = self.backbone if self.backbone is not None else _decoder(self.policy[0])
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[
            :, -logits_to_keep - 1 : -1
        ]
        # float32 head (DeepSpeed casts it to the run's precision: the values are returned as float32)
        return self.head(hidden.to(self.head.weight.dtype)).float().squeeze(-1)

    def _forward(self, input_ids, attention_mask, logits_to_keep: int) -> torch.Tensor:
        model = self.engine if self.engine is not None else self
        return model(input_ids, attention_mask, logits_to_keep)

    @torch.no_grad()
    def values(self, input_ids, attention_mask, logits_to_keep: int, batch_size: int) -> torch.Tensor:
        """Every process must call this with the same number of rows under ZeRO-3 (collective gathers)."""
        with self.active():
            chunks = [
                self._forward(input_ids[i : i + batch_size], attention_mask[i : i + batch_size], logits_to_keep)
                for i in range(0, len(input_ids), batch_size)
            ]
        return torch.cat(chunks)

    def update(
        self,
        input_ids,
        attention_mask,
        logits_to_keep,
        old_values,
        returns,
        mask,
        max_grad_norm: float = 1.0,
        reduce=None,
    ) -> dict:
        """One clipped value-regression step on a micro-batch; returns the value loss and clip fraction.

        ``reduce(params)``, if given, averages gradients across processes before clipping (FSDP and a
        DeepSpeed engine average them themselves; the engine clips at its ``gradient_clipping``).
        """
        if self.engine is not None:
            values = self.engine(input_ids, attention_mask, logits_to_keep)
            loss, clipfrac = value_loss(values, old_values, returns, mask, self.value_clip)
            self.engine.backward(loss)
            self.engine.step()
            grad_norm = self.engine.get_global_grad_norm()
            grad_norm = float("nan") if grad_norm is None else float(grad_norm)
            return {"value_loss": loss.item(), "value_clipfrac": clipfrac.item(), "value_grad_norm": grad_norm}
        with self.active():
            values = self(input_ids, attention_mask, logits_to_keep)
            loss, clipfrac = value_loss(values, old_values, returns, mask, self.value_clip)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if reduce is not None and not self.fsdp:  # FSDP has averaged them already
                reduce(self.trainable_parameters())
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), max_grad_norm)
            if hasattr(grad_norm, "full_tensor"):  # FSDP: the norm over every process's shard
                grad_norm = grad_norm.full_tensor()
            self.optimizer.step()
            # the LoRA critic's parameters live in the policy: leave no gradient for its clipping to see
            self.optimizer.zero_grad(set_to_none=True)
        return {"value_loss": loss.item(), "value_clipfrac": clipfrac.item(), "value_grad_norm": float(grad_norm)}

    # -- checkpoints ----------------------------------------------------------------------------------
    def save(self, directory: str, write: bool = True) -> None:
        """Weights as safetensors (``critic.safetensors``), optimizer state beside them, as Trainer does.

        With a sharded optimizer or a DeepSpeed engine every process must call this (gathering is
        collective); only those with ``write=True`` write the weights. Under DeepSpeed the optimizer
        state is DeepSpeed's sharded checkpoint in ``engine/`` (each process writes its shard)."""
        from safetensors.torch import save_file

        if self.engine is not None:
            optimizer_state = None
        elif self.fsdp:
            optimizer_state = self._fsdp_optimizer_state()
        else:
            optimizer_state = self._gathered_optimizer_state(write) if self.sharded else self.optimizer.state_dict()
        tensors = {f"{i:05d}": p.detach().cpu().contiguous() for i, p in enumerate(self.full_parameters())}
        if write:
            os.makedirs(directory, exist_ok=True)
            save_file(tensors, os.path.join(directory, "critic.safetensors"))
        if self.engine is not None:
            self.engine.save_checkpoint(directory, tag=ENGINE_TAG)
        elif write:
            torch.save(optimizer_state, os.path.join(directory, "critic_optimizer.pt"))  # whole, also when sharded

    def _parameter_names(self) -> list[str]:
        names = {id(p): n for n, p in self.named_parameters()}
        return [names[id(p)] for p in self.trainable_parameters()]

    def _fsdp_optimizer_state(self) -> dict:
        """FSDP: the whole AdamW state on every process, in an unsharded optimizer's layout (indices, not names)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        full = get_optimizer_state_dict(self, self.optimizer, options=StateDictOptions(full_state_dict=True))
        index = {name: i for i, name in enumerate(self._parameter_names())}
        state = {
            index[n]: {k: v.cpu() if torch.is_tensor(v) else v for k, v in s.items()} for n, s in full["state"].items()
        }
        groups = [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]
        return {"state": state, "param_groups": groups}

    def _gathered_optimizer_state(self, write: bool) -> dict | None:
        """The whole optimizer state on every process that writes (one per node with save_on_each_node)."""
        import torch.distributed as dist

        flags = [None] * dist.get_world_size()
        dist.all_gather_object(flags, write)
        state = None
        for rank, writes in enumerate(flags):
            if writes:
                self.optimizer.consolidate_state_dict(to=rank)
                if rank == dist.get_rank():
                    state = self.optimizer.state_dict()
        return state

    def load(self, directory: str) -> None:
        """Restore weights and optimizer state saved by ``save`` (under DeepSpeed: on every process,
        from a checkpoint written under DeepSpeed with the same number of processes)."""
        from safetensors.torch import load_file

        saved_by_engine = os.path.isdir(os.path.join(directory, ENGINE_TAG))
        if self.engine is not None or saved_by_engine:
            if self.engine is None or not saved_by_engine:
                raise ValueError(
                    f"{directory} was saved {'under' if saved_by_engine else 'without'} DeepSpeed and this critic runs "
                    f"{'without' if saved_by_engine else 'under'} it: resume with the same launcher config as the run that saved it."
                )
            self.engine.load_checkpoint(directory, tag=ENGINE_TAG, load_lr_scheduler_states=False)
            return

        tensors = load_file(os.path.join(directory, "critic.safetensors"))
        params = self.trainable_parameters()
        if len(tensors) != len(params):
            raise ValueError(
                f"{directory} holds {len(tensors)} critic tensors, this critic has {len(params)}: was it saved with another critic_type?"
            )
        optimizer_state = torch.load(
            os.path.join(directory, "critic_optimizer.pt"), map_location="cpu", weights_only=True
        )
        if self.fsdp:  # whole tensors in, each process keeps its shard
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            names = self._parameter_names()
            options = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(self, {n: tensors[f"{i:05d}"] for i, n in enumerate(names)}, options=options)
            optimizer_state = {
                "state": {names[i]: s for i, s in optimizer_state["state"].items()},
                "param_groups": [
                    {**g, "params": [names[i] for i in g["params"]]} for g in optimizer_state["param_groups"]
                ],
            }
            set_optimizer_state_dict(self, self.optimizer, optimizer_state, options=options)
            return
        with torch.no_grad():
            for i, p in enumerate(params):
                p.copy_(tensors[f"{i:05d}"].to(p.device, p.dtype))
        self.optimizer.load_state_dict(optimizer_state)


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


def build_critic(policy, args, accelerator, value_model=None) -> Critic | None:
    """The critic ``args.advantage_estimator`` needs (None for one that needs none), held as the
    policy is: its own DeepSpeed engine with the policy's ZeRO stage, sharded by Accelerate's FSDP2,
    or replicated. Refuses, before anything is built, the combinations that cannot work.

    ``policy`` is the unwrapped policy; ``value_model`` (a model, a Hub id / local dir, or None for
    the policy's own weights) initialises a full critic; ``args`` is the ``StarPOConfig``.
    """
    from starpo_trl.algorithms.estimators import critic_estimators, get_estimator

    if not get_estimator(args.advantage_estimator).critic:
        if value_model is not None:
            raise ValueError(
                f"value_model is only used by a critic: set advantage_estimator to one of {critic_estimators()}."
            )
        return None
    deepspeed_config = fsdp_accelerator = None
    if getattr(accelerator.state, "fsdp_plugin", None) is not None:
        if args.critic_type == "lora":
            raise ValueError(
                "The LoRA critic's adapter lives in the policy, which FSDP shards: use critic_type='full' "
                "(sharded like the policy, by Accelerate's FSDP2), or DDP / DeepSpeed ZeRO-2."
            )
        fsdp_accelerator = accelerator
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None:
        if args.critic_type == "lora" and plugin.zero_stage == 3:
            raise ValueError(
                "The LoRA critic's adapter lives in the policy, which ZeRO-3 partitions: use critic_type='full' "
                "(sharded like the policy by its own ZeRO-3 engine), or ZeRO-2."
            )
        if args.critic_type == "full":  # its own engine: sharded as the policy is
            precision = accelerator.mixed_precision
            deepspeed_config = deepspeed_critic_config(
                plugin.deepspeed_config,
                args.per_device_train_batch_size,
                args.max_grad_norm,
                precision == "bf16",
                precision == "fp16",
            )
    if isinstance(value_model, str):
        from transformers import AutoModelForCausalLM

        value_model = AutoModelForCausalLM.from_pretrained(
            value_model, dtype=policy.dtype, trust_remote_code=args.trust_remote_code
        )
    return Critic(
        policy,
        args.critic_type,
        args.critic_learning_rate,
        args.value_clip,
        args.weight_decay,
        init_from=value_model,
        deepspeed_config=deepspeed_config,
        fsdp_accelerator=fsdp_accelerator,
    )
