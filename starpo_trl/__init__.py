"""starpo-trl: multi-turn StarPO / StarPO-S agent RL on Hugging Face TRL."""

from starpo_trl.config import StarPOConfig
from starpo_trl.rollout import (
    Episode,
    HFBackend,
    RolloutConfig,
    RolloutEngine,
    StartState,
)
from starpo_trl.trainer import MultiTurnStarPOTrainer

__all__ = [
    "Episode",
    "HFBackend",
    "MultiTurnStarPOTrainer",
    "RolloutConfig",
    "RolloutEngine",
    "StarPOConfig",
    "StartState",
]
