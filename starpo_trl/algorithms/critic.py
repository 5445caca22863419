"""The critic for the PPO / GAE path: a ``ValueModel`` held the way the policy is held, with its own
AdamW optimizer, learning rate and value clipping. One holder per way, each with the same four
methods (``values``, ``step``, ``save``, ``load``); ``build_critic`` picks it from the run:

- ``ReplicatedCritic``: one process, or several under DDP. With several processes the gradients are
  averaged across them and the AdamW state is sharded (ZeRO stage 1, torch's
  ``ZeroRedundancyOptimizer``): each process keeps the moments of its share of the parameters,
  steps that share and broadcasts it, so every process ends each step with the same weights (all
  start from process 0's). ``save`` gathers the shards into one optimizer file.
- ``DeepSpeedCritic`` (policy under DeepSpeed, full critic): its own DeepSpeed engine with the
  policy's ZeRO stage, offload and precision (ZeRO-2: gradients and optimizer state sharded; ZeRO-3:
  weights too), one optimizer step per micro-batch. ``save`` writes the gathered weights plus
  DeepSpeed's sharded checkpoint (``engine/``), which ``load`` restores on the same number of processes.
- ``FSDPCritic`` (policy under FSDP2, full critic): Accelerate shards it exactly as it shards the
  policy (``fsdp2_prepare_model``: same wrap policy, offload and mixed precision); weights,
  gradients and AdamW state sharded, gradients averaged by FSDP. ``save`` gathers weights and
  optimizer state into the same files as a ``ReplicatedCritic``, so either resumes the other.

Checkpoint files (``save(directory)``): ``critic.safetensors`` (whole weights, in
``trainable_parameters()`` order) and ``critic_optimizer.pt`` (whole AdamW state), or ``engine/``.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from starpo_trl.algorithms.settings import CriticSettings
from starpo_trl.algorithms.value_model import ValueModel, is_partitioned, value_loss

ENGINE_TAG = "engine"  # DeepSpeed checkpoint folder inside the critic's directory
WEIGHTS = "critic.safetensors"
OPTIMIZER = "critic_optimizer.pt"


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


class HeldCritic:
    """What every holder shares: chunked ``values``, a plain-torch ``step``, whole-weight ``save``/``load``.
    Subclasses say how the optimizer state is gathered and restored."""

    saved_by_engine = False  # whether ``save`` writes a DeepSpeed ``engine/`` checkpoint

    def __init__(self, model: ValueModel, optimizer, value_clip: float | None):
        self.model = model
        self.optimizer = optimizer
        self.value_clip = value_clip

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.model.trainable_parameters()

    def full_parameters(self) -> list[torch.Tensor]:
        """Whole copies of ``trainable_parameters()``, also where they are sharded (collective then)."""
        return [
            p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone() for p in self.trainable_parameters()
        ]

    def _forward(self, input_ids, attention_mask, logits_to_keep: int) -> torch.Tensor:
        return self.model(input_ids, attention_mask, logits_to_keep)

    @torch.no_grad()
    def values(self, input_ids, attention_mask, logits_to_keep: int, batch_size: int) -> torch.Tensor:
        """Values (B, logits_to_keep) in chunks of ``batch_size`` rows. Every process must call this with
        the same number of rows where the weights are sharded (collective gathers)."""
        with self.model.active():
            chunks = [
                self._forward(input_ids[i : i + batch_size], attention_mask[i : i + batch_size], logits_to_keep)
                for i in range(0, len(input_ids), batch_size)
            ]
        return torch.cat(chunks)

    def step(
        self, input_ids, attention_mask, logits_to_keep, old_values, returns, mask, max_grad_norm=1.0, reduce=None
    ) -> dict:
        """One clipped value-regression step on a micro-batch; returns the value loss, clip fraction and
        gradient norm. ``reduce(params)``, if given, averages gradients across processes before clipping
        (holders whose gradients are averaged already ignore it)."""
        with self.model.active():
            values = self.model(input_ids, attention_mask, logits_to_keep)
            loss, clipfrac = value_loss(values, old_values, returns, mask, self.value_clip)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self._reduce(reduce)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), max_grad_norm)
            if hasattr(grad_norm, "full_tensor"):  # sharded: the norm over every process's shard
                grad_norm = grad_norm.full_tensor()
            self.optimizer.step()
            # the LoRA critic's parameters live in the policy: leave no gradient for its clipping to see
            self.optimizer.zero_grad(set_to_none=True)
        return {"value_loss": loss.item(), "value_clipfrac": clipfrac.item(), "value_grad_norm": float(grad_norm)}

    def _reduce(self, reduce) -> None:
        if reduce is not None:
            reduce(self.trainable_parameters())

    def fit(
        self,
        input_ids,
        attention_mask,
        logits_to_keep,
        old_values,
        returns,
        mask,
        epochs: int,
        micro_batches: int,
        generator: torch.Generator,
        max_grad_norm: float = 1.0,
        reduce=None,
    ) -> list[dict]:
        """Learn on a rollout batch, PPO-style: ``epochs`` passes over its rows, each in a new random order
        drawn from ``generator``, split into ``micro_batches`` micro-batches (fewer if there are fewer
        rows), one ``step`` each. Returns every step's statistics. Every process must draw the same
        order (same generator state) and hold the same number of rows."""
        n = len(input_ids)
        stats = []
        for _ in range(epochs if n else 0):
            for rows in torch.randperm(n, generator=generator).to(input_ids.device).chunk(min(micro_batches, n)):
                stats.append(
                    self.step(
                        input_ids[rows],
                        attention_mask[rows],
                        logits_to_keep,
                        old_values[rows],
                        returns[rows],
                        mask[rows],
                        max_grad_norm,
                        reduce=reduce,
                    )
                )
        return stats

    # -- checkpoints ----------------------------------------------------------------------------------
    def save(self, directory: str, write: bool = True) -> None:
        """Whole weights (``critic.safetensors``) and optimizer state beside them, as Trainer does. Every
        process must call this where anything is sharded (gathering is collective); only those with
        ``write=True`` write."""
        from safetensors.torch import save_file

        optimizer_state = self._optimizer_state(write)
        tensors = {f"{i:05d}": p.detach().cpu().contiguous() for i, p in enumerate(self.full_parameters())}
        if write:
            os.makedirs(directory, exist_ok=True)
            save_file(tensors, os.path.join(directory, WEIGHTS))
        self._write_optimizer(directory, optimizer_state, write)

    def _optimizer_state(self, write: bool) -> dict | None:
        return self.optimizer.state_dict()

    def _write_optimizer(self, directory: str, state: dict | None, write: bool) -> None:
        if write:
            torch.save(state, os.path.join(directory, OPTIMIZER))  # whole, also when sharded

    def load(self, directory: str) -> None:
        """Restore weights and optimizer state written by ``save`` (a DeepSpeed checkpoint only into a
        ``DeepSpeedCritic`` on the same number of processes)."""
        saved_by_engine = os.path.isdir(os.path.join(directory, ENGINE_TAG))
        if saved_by_engine != self.saved_by_engine:
            raise ValueError(
                f"{directory} was saved {'under' if saved_by_engine else 'without'} DeepSpeed and this critic runs "
                f"{'without' if saved_by_engine else 'under'} it: resume with the same launcher config as the run that saved it."
            )
        self._load(directory)

    def _saved(self, directory: str) -> tuple[list[torch.Tensor], dict]:
        """The whole weights (in ``trainable_parameters()`` order) and optimizer state in ``directory``."""
        from safetensors.torch import load_file

        tensors = load_file(os.path.join(directory, WEIGHTS))
        n = len(self.trainable_parameters())
        if len(tensors) != n:
            raise ValueError(
                f"{directory} holds {len(tensors)} critic tensors, this critic has {n}: was it saved with another critic_type?"
            )
        optimizer_state = torch.load(os.path.join(directory, OPTIMIZER), map_location="cpu", weights_only=True)
        return [tensors[f"{i:05d}"] for i in range(n)], optimizer_state

    def _load(self, directory: str) -> None:
        tensors, optimizer_state = self._saved(directory)
        with torch.no_grad():
            for p, t in zip(self.trainable_parameters(), tensors):
                p.copy_(t.to(p.device, p.dtype))
        self.optimizer.load_state_dict(optimizer_state)


class ReplicatedCritic(HeldCritic):
    """Weights on every process; AdamW state sharded (ZeRO-1) when several processes train together."""

    def __init__(
        self,
        model: ValueModel,
        learning_rate: float = 1e-5,
        weight_decay: float = 0.01,
        value_clip: float | None = 0.5,
        shard_optimizer: bool | None = None,
    ):
        if shard_optimizer is None:
            shard_optimizer = (
                torch.distributed.is_available()
                and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() > 1
            )
        self.sharded = shard_optimizer
        params = model.trainable_parameters()
        if not shard_optimizer:
            optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            # every process starts from process 0's critic (a LoRA adapter's random init differs per process)
            with torch.no_grad():
                for p in params:
                    torch.distributed.broadcast(p.data, src=0)
            optimizer = ZeroRedundancyOptimizer(
                params, optimizer_class=torch.optim.AdamW, lr=learning_rate, weight_decay=weight_decay
            )
        super().__init__(model, optimizer, value_clip)

    def _optimizer_state(self, write: bool) -> dict | None:
        """The whole optimizer state on every process that writes (one per node with save_on_each_node)."""
        if not self.sharded:
            return self.optimizer.state_dict()
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


class DeepSpeedCritic(HeldCritic):
    """A DeepSpeed engine of its own; ``deepspeed.initialize`` broadcasts process 0's weights, then shards."""

    saved_by_engine = True

    def __init__(
        self,
        model: ValueModel,
        config: dict,
        learning_rate: float = 1e-5,
        weight_decay: float = 0.01,
        value_clip: float | None = 0.5,
    ):
        import deepspeed

        if model.critic_type != "full":
            raise ValueError(
                "A sharded critic needs critic_type='full': the LoRA critic's adapter lives in the policy."
            )
        optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=learning_rate, weight_decay=weight_decay)
        self.engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        super().__init__(model, optimizer, value_clip)

    def full_parameters(self) -> list[torch.Tensor]:
        params = self.trainable_parameters()
        if not is_partitioned(params):  # ZeRO-2: whole on every process
            return super().full_parameters()
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return [p.detach().clone() for p in params]

    def _forward(self, input_ids, attention_mask, logits_to_keep: int) -> torch.Tensor:
        return self.engine(input_ids, attention_mask, logits_to_keep)

    def step(
        self, input_ids, attention_mask, logits_to_keep, old_values, returns, mask, max_grad_norm=1.0, reduce=None
    ) -> dict:
        """The engine averages gradients and clips them at its ``gradient_clipping`` (``max_grad_norm`` and
        ``reduce`` are the config's business here)."""
        values = self.engine(input_ids, attention_mask, logits_to_keep)
        loss, clipfrac = value_loss(values, old_values, returns, mask, self.value_clip)
        self.engine.backward(loss)
        self.engine.step()
        grad_norm = self.engine.get_global_grad_norm()
        grad_norm = float("nan") if grad_norm is None else float(grad_norm)
        return {"value_loss": loss.item(), "value_clipfrac": clipfrac.item(), "value_grad_norm": grad_norm}

    def _optimizer_state(self, write: bool) -> None:
        return None  # each process writes its own shard

    def _write_optimizer(self, directory: str, state: None, write: bool) -> None:
        self.engine.save_checkpoint(directory, tag=ENGINE_TAG)

    def _load(self, directory: str) -> None:
        self.engine.load_checkpoint(directory, tag=ENGINE_TAG, load_lr_scheduler_states=False)


class FSDPCritic(HeldCritic):
    """Accelerate shards the value model as it shards the policy; AdamW then runs over the shards."""

    def __init__(
        self,
        model: ValueModel,
        accelerator,
        learning_rate: float = 1e-5,
        weight_decay: float = 0.01,
        value_clip: float | None = 0.5,
    ):
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        if model.critic_type != "full":
            raise ValueError(
                "A sharded critic needs critic_type='full': the LoRA critic's adapter lives in the policy."
            )
        if accelerator.state.fsdp_plugin.fsdp_version != 2:
            raise ValueError("The critic is sharded with FSDP2 only: set fsdp_version: 2 in the accelerate config.")
        model._no_split_modules = model.layer_classes  # the layers Accelerate's wrap policy wraps one by one
        fsdp2_prepare_model(accelerator, model)  # in place; process 0's weights everywhere
        optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=learning_rate, weight_decay=weight_decay)
        super().__init__(model, optimizer, value_clip)

    def _reduce(self, reduce) -> None:
        pass  # FSDP has averaged the gradients already

    def _optimizer_state(self, write: bool) -> dict:
        """The whole AdamW state on every process, in a ``ReplicatedCritic``'s layout (indices, not names)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        full = get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(full_state_dict=True))
        index = {name: i for i, name in enumerate(self.model.parameter_names())}
        state = {
            index[n]: {k: v.cpu() if torch.is_tensor(v) else v for k, v in s.items()} for n, s in full["state"].items()
        }
        groups = [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]
        return {"state": state, "param_groups": groups}

    def _load(self, directory: str) -> None:
        """Whole tensors in, each process keeps its shard."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        tensors, optimizer_state = self._saved(directory)
        names = self.model.parameter_names()
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(self.model, dict(zip(names, tensors)), options=options)
        optimizer_state = {
            "state": {names[i]: s for i, s in optimizer_state["state"].items()},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"]]} for g in optimizer_state["param_groups"]
            ],
        }
        set_optimizer_state_dict(self.model, self.optimizer, optimizer_state, options=options)


def make_critic(
    policy,
    critic_type: str = "full",
    learning_rate: float = 1e-5,
    value_clip: float | None = 0.5,
    weight_decay: float = 0.01,
    shard_optimizer: bool | None = None,
    init_from=None,
    deepspeed_config: dict | None = None,
    fsdp_accelerator=None,
) -> HeldCritic:
    """A ``ValueModel`` from ``policy`` (or ``init_from``) in its holder: a ``DeepSpeedCritic`` with
    ``deepspeed_config``, an ``FSDPCritic`` with ``fsdp_accelerator``, else a ``ReplicatedCritic``."""
    if (deepspeed_config is not None or fsdp_accelerator is not None) and critic_type != "full":
        raise ValueError("A sharded critic needs critic_type='full': the LoRA critic's adapter lives in the policy.")
    model = ValueModel(policy, critic_type, init_from)
    if fsdp_accelerator is not None:
        return FSDPCritic(model, fsdp_accelerator, learning_rate, weight_decay, value_clip)
    if deepspeed_config is not None:
        return DeepSpeedCritic(model, deepspeed_config, learning_rate, weight_decay, value_clip)
    return ReplicatedCritic(model, learning_rate, weight_decay, value_clip, shard_optimizer)


def _sharding(critic_type: str, accelerator, micro_batch: int, max_grad_norm: float):
    """How a critic of ``critic_type`` is held beside the policy: ``(deepspeed_config, fsdp_accelerator)``, the
    first for a full critic with its own DeepSpeed engine (the policy's ZeRO stage), the second for one sharded by
    Accelerate's FSDP2, both None for a replicated one. Refuses a LoRA critic where the policy is sharded."""
    deepspeed_config = fsdp_accelerator = None
    if getattr(accelerator.state, "fsdp_plugin", None) is not None:
        if critic_type == "lora":
            raise ValueError(
                "The LoRA critic's adapter lives in the policy, which FSDP shards: use critic_type='full' "
                "(sharded like the policy, by Accelerate's FSDP2), or DDP / DeepSpeed ZeRO-2."
            )
        fsdp_accelerator = accelerator
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None:
        if critic_type == "lora" and plugin.zero_stage == 3:
            raise ValueError(
                "The LoRA critic's adapter lives in the policy, which ZeRO-3 partitions: use critic_type='full' "
                "(sharded like the policy by its own ZeRO-3 engine), or ZeRO-2."
            )
        if critic_type == "full":  # its own engine: sharded as the policy is
            precision = accelerator.mixed_precision
            deepspeed_config = deepspeed_critic_config(
                plugin.deepspeed_config,
                micro_batch,
                max_grad_norm,
                precision == "bf16",
                precision == "fp16",
            )
    return deepspeed_config, fsdp_accelerator


def build_critic(
    policy,
    settings: CriticSettings,
    estimator: str,
    accelerator,
    *,
    micro_batch: int,
    max_grad_norm: float,
    weight_decay: float,
    trust_remote_code: bool = False,
    value_model=None,
) -> HeldCritic | None:
    """The critic the advantage ``estimator`` needs (None for one that needs none), held as the
    policy is: its own DeepSpeed engine with the policy's ZeRO stage, sharded by Accelerate's FSDP2,
    or replicated. Refuses, before anything is built, the combinations that cannot work.

    ``policy`` is the unwrapped policy; ``settings`` the critic's own; ``micro_batch``, ``max_grad_norm``,
    ``weight_decay`` and ``trust_remote_code`` are the run's (TRL's training arguments), which the critic's
    DeepSpeed engine and optimizer follow. ``value_model`` (a model, a Hub id / local dir, or None for the
    policy's own weights) initialises a full critic.
    """
    from starpo_trl.algorithms.estimators import critic_estimators, get_estimator

    if not get_estimator(estimator).critic:
        if value_model is not None:
            raise ValueError(
                f"value_model is only used by a critic: set advantage_estimator to one of {critic_estimators()}."
            )
        return None
    deepspeed_config, fsdp_accelerator = _sharding(settings.critic_type, accelerator, micro_batch, max_grad_norm)
    if isinstance(value_model, str):
        from transformers import AutoModelForCausalLM

        value_model = AutoModelForCausalLM.from_pretrained(
            value_model, dtype=policy.dtype, trust_remote_code=trust_remote_code
        )
    return make_critic(
        policy,
        settings.critic_type,
        settings.critic_learning_rate,
        settings.value_clip,
        weight_decay,
        init_from=value_model,
        deepspeed_config=deepspeed_config,
        fsdp_accelerator=fsdp_accelerator,
    )
