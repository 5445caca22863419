"""Playing episodes: the engine, the chat format, generation backends (HF, vLLM), prompts and reply
parsing, reasoning shaping, env runners and LoRA weight sync."""

from starpo_trl.rollout.chat_format import ChatFormat
from starpo_trl.rollout.engine import (
    Episode,
    GenerationBackend,
    Rollout,
    RolloutConfig,
    RolloutEngine,
    StartState,
)
from starpo_trl.rollout.hf_backend import HFBackend, sampling_config

__all__ = [
    "ChatFormat",
    "Episode",
    "GenerationBackend",
    "HFBackend",
    "Rollout",
    "RolloutConfig",
    "RolloutEngine",
    "StartState",
    "sampling_config",
]
