"""StarPO's algorithms: group statistics, the rollout filter, advantage estimators and scoring as pure
functions, checked against numbers worked out by hand; their settings (``settings.py``); and the critic, the
one stateful part (``value_model.py``: its network and loss; ``critic.py``: how it is held, with its optimizer;
``critic_targets.py``: what it gives a step)."""

from starpo_trl.algorithms.advantages import (
    bilevel_gae,
    grpo_advantages,
    masked_gae,
    normalize_rewards,
    place_rewards,
    reward_normalization_terms,
    rloo_advantages,
    turn_end_mask,
    turn_spans,
)
from starpo_trl.algorithms.estimators import (
    ESTIMATORS,
    critic_estimators,
    get_estimator,
    register_advantage_estimator,
)
from starpo_trl.algorithms.filters import expand_groups, num_kept_groups, select_groups
from starpo_trl.algorithms.stats import (
    between_group_share,
    centred,
    constant_groups,
    group_std,
    nanstd,
    whiten,
)

__all__ = [
    "ESTIMATORS",
    "critic_estimators",
    "get_estimator",
    "register_advantage_estimator",
    "between_group_share",
    "bilevel_gae",
    "centred",
    "constant_groups",
    "expand_groups",
    "group_std",
    "grpo_advantages",
    "masked_gae",
    "nanstd",
    "normalize_rewards",
    "num_kept_groups",
    "place_rewards",
    "reward_normalization_terms",
    "rloo_advantages",
    "select_groups",
    "turn_end_mask",
    "turn_spans",
    "whiten",
]
