"""Logged metric keys that other parts read back (the collapse guard, plots, the dashboard).

``{env}`` is the env's short name (``envs.contract.env_name``: ``starpo/Sokoban-v0`` -> ``Sokoban-v0``).
"""

SUCCESS = "env/{env}/success"
FORMAT_ERROR_RATE = "env/{env}/format_error_rate"
GROUP_REWARD_STD = "env/{env}/group_reward_std_mean"
ENTROPY = "entropy"
GRAD_NORM = "grad_norm"
REASONING_RATE = "reasoning/reasoning_rate"
DISTINCT_2 = "reasoning/distinct_2"
TEMPLATE_SHARE = "reasoning/template_share"
MI_ESTIMATE = "collapse/mi_estimate"
RETRIEVAL_ACCURACY = "collapse/retrieval_accuracy"
RETRIEVAL_CHANCE = "collapse/retrieval_chance"
