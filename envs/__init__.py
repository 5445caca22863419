"""Text environments for multi-turn agent RL, registered in Gymnasium's ``starpo`` namespace.

``import envs`` registers:

================================  ===============================================================
``starpo/Bandit-v0``         two named arms, one pull (``envs.bandit``)
``starpo/BanditTest-v0``     the same with held-out arm names (Tiger / Crane), for the generalisation check
``starpo/BanditHeldout-v0``  16 held-out name pairs (``HELDOUT_PAIRS``), pair ``seed % 16``
``starpo/BanditPayouts-v0``  the 12 training pairs with payouts drawn per seed (the safe arm better in about half)
``starpo/BanditPayoutsHeldout-v0``  the held-out pairs with payouts drawn per seed
``starpo/BanditSymbolic-v0``  the paper's form: names only (Phoenix / Dragon), reason from their meaning
``starpo/BanditSymbolicTest-v0``  the same with held-out name pairs
``starpo/Sokoban-v0``        6x6 room, one box (``envs.sokoban``)
``starpo/SokobanAlt-v0``     the same with another symbol set
``starpo/FrozenLake-v0``     random slippery 4x4 lake per seed (``envs.frozen_lake``)
``starpo/Countdown-v0``      reach a target with + - * / (``envs.countdown``)
``starpo/Arithmetic-v0``     generated math questions (``envs.arithmetic``)
``starpo/Taxi-v0``           Gymnasium's Taxi as text (``envs.toy_text``)
``starpo/CliffWalking-v0``   Gymnasium's CliffWalking as text (``envs.toy_text``)
``starpo/ReasoningGym-v0``   any reasoning-gym dataset, its scorer as reward (``envs.reasoning_gym_env``)
================================  ===============================================================

Any of them: ``gymnasium.make("starpo/Sokoban-v0", dim_room=(8, 8), num_boxes=2)``.

Not a task, and so not in ``ENV_IDS``: ``starpo/Sleepy-v0`` (``envs.sleepy``), whose ``step`` waits
``latency`` seconds, stands in for a slow env when measuring how a turn's episodes are stepped;
``starpo/OpenEnv-v0`` (``envs.openenv_env``, ``base_url=...``) plays a running OpenEnv server, and
``python -m envs.serve ENV_ID`` serves any of these envs as one.
"""

from gymnasium.envs.registration import register, registry

from envs.bandit import HELDOUT_PAIRS, PAYOUT_TRAIN_PAIRS
from envs.base import TextEnv, noisy_expert_action

ENV_IDS: dict[str, tuple[str, dict]] = {
    "starpo/Bandit-v0": ("envs.bandit:BanditEnv", {}),
    "starpo/BanditTest-v0": ("envs.bandit:BanditEnv", {"arm_names": ("Tiger", "Crane")}),
    "starpo/BanditHeldout-v0": ("envs.bandit:BanditEnv", {"arm_names": HELDOUT_PAIRS, "pair_by_seed": True}),
    "starpo/BanditPayouts-v0": ("envs.bandit:BanditEnv", {"arm_names": PAYOUT_TRAIN_PAIRS, "vary_payouts": True}),
    "starpo/BanditPayoutsHeldout-v0": (
        "envs.bandit:BanditEnv",
        {"arm_names": HELDOUT_PAIRS, "pair_by_seed": True, "vary_payouts": True},
    ),
    "starpo/BanditSymbolic-v0": ("envs.bandit:BanditEnv", {"arm_names": ("Phoenix", "Dragon"), "show_payouts": False}),
    "starpo/BanditSymbolicTest-v0": (
        "envs.bandit:BanditEnv",
        {
            "arm_names": [("Turtle", "Shark"), ("Bank", "Casino"), ("Shield", "Sword"), ("Oak", "Storm")],
            "show_payouts": False,
        },
    ),
    "starpo/Sokoban-v0": ("envs.sokoban:SokobanEnv", {}),
    "starpo/SokobanAlt-v0": ("envs.sokoban:SokobanEnv", {"symbols": "alt"}),
    "starpo/FrozenLake-v0": ("envs.frozen_lake:FrozenLakeEnv", {}),
    "starpo/Countdown-v0": ("envs.countdown:CountdownEnv", {}),
    "starpo/Arithmetic-v0": ("envs.arithmetic:ArithmeticEnv", {}),
    "starpo/Taxi-v0": ("envs.toy_text:taxi", {}),
    "starpo/CliffWalking-v0": ("envs.toy_text:cliff_walking", {}),
    "starpo/ReasoningGym-v0": ("envs.reasoning_gym_env:ReasoningGymEnv", {}),
}

for _id, (_entry, _kwargs) in ENV_IDS.items():
    if _id not in registry:
        # No TimeLimit/OrderEnforcing wrappers: each env counts its own steps, and the episode
        # engine drives reset/step itself.
        register(id=_id, entry_point=_entry, kwargs=_kwargs, disable_env_checker=True, order_enforce=False)

# a running OpenEnv server (base_url=...) as a text env: not in ENV_IDS, it needs a server
if "starpo/OpenEnv-v0" not in registry:
    register(
        id="starpo/OpenEnv-v0",
        entry_point="envs.openenv_env:OpenEnvTextEnv",
        disable_env_checker=True,
        order_enforce=False,
    )
if "starpo/Sleepy-v0" not in registry:
    register(id="starpo/Sleepy-v0", entry_point="envs.sleepy:SleepyEnv", disable_env_checker=True, order_enforce=False)

__all__ = ["ENV_IDS", "TextEnv", "noisy_expert_action"]
