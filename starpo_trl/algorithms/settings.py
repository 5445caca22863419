"""The algorithms' settings: the variance filter (``FilterSettings``), from rewards to advantages
(``AdvantageSettings``; both together: ``ScoringSettings``) and the critic (``CriticSettings``).

Each class is the one definition of its fields (defaults, help, the checks among them); ``StarPOConfig`` is
composed from them, so the names are the same on the command line and in recipes. The functions of this
wing take these typed settings; the checks that need other settings too (the number of start states, the
loss type, the envs) are ``StarPOConfig``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starpo_trl.algorithms.estimators import get_estimator
from starpo_trl.algorithms.filters import GROUP_METRICS, STRATEGIES, TOP_P_MODES
from starpo_trl.algorithms.gigpo import GIGPO_MODES
from starpo_trl.numeric_settings import Range, check_declared
from starpo_trl.settings_base import Settings

FILTER_METRICS = (*GROUP_METRICS, "std_rev", "none")  # std_rev: std, smallest first; none: keep every group
REWARD_NORMALIZATIONS = ("identity", "mean", "mean_std", "asym_clip")
ENV_ERROR_POLICIES = ("exclude", "failure_reward")
REWARD_FUNC_ERRORS = ("raise", "mark")  # what a failing reward function does (algorithms.scoring)


@dataclass
class FilterSettings(Settings):
    r"""
    StarPO-S's variance filter: which groups of a step are trained on (see `starpo_trl.algorithms.filters`).

    Parameters:
        rollout_filter_strategy (`str`, `"top_k"`): how groups are kept, by their score, with
            `rollout_filter_ratio` as its value: `top_k` (that share of groups, rounded up: the paper's rule),
            `top_k_abs` (that many groups), `top_p` (`linear`: best first until the cumulative score reaches
            `ratio * sum - rollout_filter_eps`; `softmax`: until the softmax mass reaches `ratio`), `min_p`
            (score >= `ratio` x the best).
        rollout_filter_ratio (`float`, 0.25): the strategy's value. With `top_k`, 1.0 keeps all (plain GRPO).
        rollout_filter_metric (`str`, `"std"`): the group score, on raw rewards: `std` of the in-group
            reward; `reward_variance`, RAGEN's name, computed as RAGEN's code does (the in-group std: the
            same as `std`); `variance` (the std squared: ranks as `std`, but shares of the total differ for
            linear `top_p` and `min_p`); `mean` reward, `entropy` (mean -log p of the sampled model tokens),
            `length` (model tokens per episode); `none` keeps every group; `std_rev` is `std` with
            `smallest`. RAGEN's current recommendation: `reward_variance`, `top_p` 0.9 `linear`,
            `rollout_filter_include_zero=False` (`recipes/sokoban-qwen2.5-0.5b-ragen2.yaml`).
        rollout_filter_type (`str`, `"largest"`): keep the highest scores, or the `smallest`.
        rollout_filter_include_zero (`bool`, True): False never keeps a zero-score group.
        rollout_filter_top_p_mode (`str`, `"linear"`) / rollout_filter_eps (`float`, 0.01): see `top_p`.
        rollout_filter_scope (`str`, `"per_env"`): with several training envs the filter ranks the groups of
            each env among themselves, its value applied per env (a quota: one env's variance cannot starve
            another), or the whole batch together (`global`).
        When the number of kept groups can vary (`top_p`, `min_p`, or `include_zero=False`), the kept rows
        are dealt evenly to the processes (the lowest-ranked groups dropped until they divide) and each
        process pads its share with copies that hold no model token up to a multiple of
        `steps_per_generation`; the loss must then divide by the batch's token count (`loss_type` dapo,
        cispo or vespo; the default), so padding changes nothing. A step that keeps nothing is skipped
        (`rollout/empty_after_filter`).
        rollout_filter_empty_stop_steps (`int`, 5): that many such steps in a row stop training.
        rollout_filter_refill (`bool`, False): dynamic sampling. When a training step's filter keeps fewer
            groups than the refill's target, play further rounds from new start states (training seeds not
            played before in the run; as many groups per round as `num_start_states`, each round filtered on
            its own) until it has them or `rollout_filter_max_rounds` rounds were played, then train on the
            best that many by the filter's score (or all, when fewer). Needs a filter that can keep fewer
            (`rollout_filter_include_zero=False`, or `top_p` / `min_p`). Logged: `rollout/refill_rounds`,
            `rollout/groups_generated`, `rollout/groups_generated_per_kept`, `rollout/refill_short`.
            Held-out evaluation never refills (see `starpo_trl.refill`).
        rollout_filter_max_rounds (`int`, 4): rounds a refilled step plays at most, the first included.
        rollout_filter_refill_groups (`int`, None): the kept-group count a refill aims at, at most
            `num_start_states`; None: the strategy's own count (`top_k`: `ceil(ratio x num_start_states)`
            per env scope, `top_k_abs`: `ratio`), or `num_start_states` with `top_p` / `min_p`.
    """

    rollout_filter_ratio: float = field(
        default=0.25, metadata={"help": "The filter's value: top_k share, top_k_abs count, top_p p, min_p fraction."}
    )
    rollout_filter_strategy: str = field(default="top_k", metadata={"help": "top_k, top_k_abs, top_p or min_p."})
    rollout_filter_metric: str = field(
        default="std",
        metadata={
            "help": "Group score: std, reward_variance (RAGEN's: the std), variance, mean, entropy, length (or std_rev, none)."
        },
    )
    rollout_filter_type: str = field(default="largest", metadata={"help": "Keep the largest or smallest scores."})
    rollout_filter_include_zero: bool = field(default=True, metadata={"help": "False never keeps zero-score groups."})
    rollout_filter_top_p_mode: str = field(default="linear", metadata={"help": "top_p mass: linear or softmax."})
    rollout_filter_eps: float = field(default=0.01, metadata={"help": "top_p linear: threshold slack."})
    rollout_filter_scope: str = field(
        default="per_env", metadata={"help": "Several envs: filter per_env (a quota) or global."}
    )
    rollout_filter_empty_stop_steps: int = field(
        default=5, metadata={"help": "Stop after this many steps in a row whose filter kept nothing."}
    )
    rollout_filter_refill: bool = field(
        default=False,
        metadata={"help": "Play more rounds from new start states while the filter keeps too few groups."},
    )
    rollout_filter_max_rounds: int = field(default=4, metadata={"help": "Refill: rounds per step at most."})
    rollout_filter_refill_groups: int | None = field(
        default=None, metadata={"help": "Refill: kept groups to reach (default: the strategy's count)."}
    )

    @property
    def kept_count_varies(self) -> bool:
        """Whether the number of groups the filter keeps can change from step to step (``top_p``, ``min_p``, or
        zero-score groups never kept); ``none`` and ``top_k`` / ``top_k_abs`` with zeros allowed keep a fixed count."""
        if self.rollout_filter_metric == "none":
            return False
        return not self.rollout_filter_include_zero or self.rollout_filter_strategy in ("top_p", "min_p")

    def check_filter(self) -> None:
        """The rules among these settings (ranges: ``FILTER_RANGES``)."""
        if self.rollout_filter_scope not in ("per_env", "global"):
            raise ValueError(f"rollout_filter_scope must be 'per_env' or 'global', got {self.rollout_filter_scope!r}")
        if self.rollout_filter_metric not in FILTER_METRICS:
            raise ValueError(
                f"rollout_filter_metric must be one of {FILTER_METRICS}, got {self.rollout_filter_metric!r}"
            )
        strategy, value = self.rollout_filter_strategy, self.rollout_filter_ratio
        for name, allowed in (
            ("rollout_filter_strategy", STRATEGIES),
            ("rollout_filter_type", ("largest", "smallest")),
            ("rollout_filter_top_p_mode", TOP_P_MODES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if strategy == "top_k_abs":
            if value < 1 or value != int(value):
                raise ValueError(
                    f"rollout_filter_ratio={value} with top_k_abs is the number of groups kept: use a whole number >= 1."
                )
        elif not 0.0 < value <= 1.0:
            raise ValueError(
                f"rollout_filter_ratio={value} keeps no group: with {strategy} use a value in (0, 1] "
                "(top_k 0.25 keeps the top quarter of groups; 1.0 disables the filter)."
            )
        if self.rollout_filter_empty_stop_steps < 1:
            raise ValueError(
                f"rollout_filter_empty_stop_steps must be at least 1, got {self.rollout_filter_empty_stop_steps}"
            )
        uses_shares = (strategy == "top_p" and self.rollout_filter_top_p_mode == "linear") or strategy == "min_p"
        if uses_shares and self.rollout_filter_metric == "mean":
            raise ValueError(
                f"{strategy} compares shares of the group scores, and mean rewards can be negative: use the "
                "softmax top_p mode or top_k with rollout_filter_metric='mean', or another metric."
            )
        if (
            strategy == "top_p"
            and self.rollout_filter_top_p_mode == "linear"
            and self.rollout_filter_type == "smallest"
        ):
            raise ValueError(
                "top_p linear keeps a share of the score mass from the top: use largest, or softmax mode."
            )
        if self.rollout_filter_eps < 0:
            raise ValueError(f"rollout_filter_eps must be >= 0, got {self.rollout_filter_eps}")
        if self.rollout_filter_refill:
            self._check_refill()

    def _check_refill(self) -> None:
        if not self.kept_count_varies:
            raise ValueError(
                f"rollout_filter_refill=True never refills: rollout_filter_metric={self.rollout_filter_metric!r} with "
                f"{self.rollout_filter_strategy!r} and include_zero={self.rollout_filter_include_zero} keeps the same "
                "number of groups every step. Set rollout_filter_include_zero=False (zero-variance groups are dropped, "
                "then replaced) or use top_p / min_p, or turn the refill off."
            )
        if self.rollout_filter_max_rounds < 2:
            raise ValueError(
                f"rollout_filter_max_rounds={self.rollout_filter_max_rounds} plays no extra round: set it to 2 or more "
                "with rollout_filter_refill=True."
            )


@dataclass
class AdvantageSettings(Settings):
    r"""
    From episode rewards to advantages: the estimator, its discounts, reward normalisation, what a failed
    episode becomes, and the zero-advantage skip.

    Parameters:
        advantage_estimator (`str`, `"grpo"`): `grpo` (group mean/std), `rloo` (leave-one-out
            baseline), `reinforce_pp` (REINFORCE++: batch mean/std, so a group whose rewards agree
            still learns against the rest of the batch; needs `scale_rewards` `batch` or `none`),
            `gae` (critic, token-level GAE over model tokens), `bilevel_gae` (GAE across turns with
            `turn_gamma`, then token-level GAE inside each turn), `turn_gae` (every token of a turn
            gets its turn's advantage), `gigpo` (no critic: the episode's advantage in its group plus
            `step_advantage_weight` x its turn's discounted return (`turn_gamma`) against the turns of
            the group that started from the same state; `gigpo_mode` `mean_norm` or `mean_std_norm`;
            see `starpo_trl.algorithms.gigpo`).
        gamma / lam (`float`, 1.0 / 1.0): token-level GAE discount and lambda (paper: 1.0 / 1.0).
        turn_gamma (`float`, 0.95) / turn_lambda (`float` or `None` = `lam`): turn-level GAE.
        use_turn_rewards (`bool`, False): put each turn's reward on its last model token instead of
            the whole episode's reward on the last one.
        reward_normalization (`str`, `"identity"`): `identity`, `mean`, `mean_std` or `asym_clip`,
            applied per `reward_norm_scope` (`group` or `batch`) AFTER the variance filter.
        env_error_policy (`str`, `"exclude"`): what an episode whose env raised, timed out or paid
            a non-finite reward becomes: `exclude` (out of the loss and of its group's statistics)
            or `failure_reward` (trained on, with reward `env_failure_reward`, default 0.0).
        reward_func_errors (`str`, `"raise"`): a `reward_funcs` function (see `MultiTurnStarPOTrainer`)
            that raises or returns other than one number per episode stops training with an error that
            names it (`raise`), or ends every episode of that call as an env error (`mark`: counted in
            `env/errors`, then `env_error_policy`). A NaN or infinite reward from one ends that episode
            as an env error either way.
        skip_zero_advantage_steps (`bool`, False): a step whose kept episodes all have advantage
            exactly 0 (every group agreed, or with `reinforce_pp` the whole batch) makes no optimizer
            update, `rollout/zero_advantage_step` logged as 1. Without it the step's only gradient is the
            entropy bonus (and the KL term), which AdamW scales to a full-size step in no direction the
            reward chose. Group estimators only; never stops training (a solved task keeps being
            sampled, cheaply).
    """

    advantage_estimator: str = field(
        default="grpo",
        metadata={"help": "grpo, rloo, reinforce_pp, gae, bilevel_gae, turn_gae or gigpo."},
    )
    gamma: float = field(default=1.0, metadata={"help": "Token-level GAE discount."})
    lam: float = field(default=1.0, metadata={"help": "Token-level GAE lambda."})
    turn_gamma: float = field(default=0.95, metadata={"help": "Turn-level discount of bi-level GAE."})
    turn_lambda: float | None = field(
        default=None, metadata={"help": "Turn-level lambda of bi-level GAE (default: lam)."}
    )
    gigpo_mode: str = field(
        default="mean_norm",
        metadata={"help": "GiGPO: mean_norm (minus the group mean) or mean_std_norm (then / std)."},
    )
    step_advantage_weight: float = field(
        default=1.0, metadata={"help": "GiGPO: weight of the turn-level (anchor state) advantage."}
    )
    use_turn_rewards: bool = field(default=False, metadata={"help": "Each turn's reward on its last model token."})
    reward_normalization: str = field(
        default="identity", metadata={"help": "identity, mean, mean_std or asym_clip (after filtering)."}
    )
    reward_norm_scope: str = field(default="group", metadata={"help": "Normalise rewards per group or per batch."})
    env_error_policy: str = field(
        default="exclude", metadata={"help": "exclude or failure_reward, for episodes whose env failed."}
    )
    env_failure_reward: float = field(
        default=0.0, metadata={"help": "Reward of a failed episode under env_error_policy=failure_reward."}
    )
    reward_func_errors: str = field(
        default="raise",
        metadata={
            "help": "A reward function that raises: raise (stop, naming it) or mark (its episodes end as env errors)."
        },
    )
    skip_zero_advantage_steps: bool = field(
        default=False,
        metadata={"help": "No optimizer update in a step whose advantages are all 0 (group estimators)."},
    )

    def check_advantages(self) -> None:
        """The rules among these settings (ranges: ``ADVANTAGE_RANGES``)."""
        estimator = get_estimator(self.advantage_estimator)  # unknown names fail here, listing the registered ones
        if self.gigpo_mode not in GIGPO_MODES:
            raise ValueError(f"gigpo_mode must be one of {GIGPO_MODES}, got {self.gigpo_mode!r}")
        if self.skip_zero_advantage_steps and (estimator.critic or estimator.per_turn):
            raise ValueError(
                f"skip_zero_advantage_steps needs a group estimator (grpo, rloo, reinforce_pp): with "
                f"{self.advantage_estimator!r} the advantages are per token (a critic's, or GiGPO's per turn)."
            )
        for name in ("gamma", "lam", "turn_gamma", "turn_lambda"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is a discount / GAE weight in [0, 1], got {value}")
        if self.reward_normalization not in REWARD_NORMALIZATIONS:
            raise ValueError(
                f"reward_normalization must be identity, mean, mean_std or asym_clip, got {self.reward_normalization!r}"
            )
        if self.reward_norm_scope not in ("group", "batch"):
            raise ValueError(f"reward_norm_scope must be group or batch, got {self.reward_norm_scope!r}")
        if self.use_turn_rewards and self.reward_normalization == "asym_clip":
            raise ValueError(
                "reward_normalization='asym_clip' cannot be split over turns: use mean_std with use_turn_rewards, or turn rewards off."
            )
        if self.reward_func_errors not in REWARD_FUNC_ERRORS:
            raise ValueError(
                f"reward_func_errors must be one of {REWARD_FUNC_ERRORS}, got {self.reward_func_errors!r}"
            )
        if self.env_error_policy not in ENV_ERROR_POLICIES:
            raise ValueError(f"env_error_policy must be 'exclude' or 'failure_reward', got {self.env_error_policy!r}")


@dataclass
class CriticSettings(Settings):
    r"""
    The critic of the GAE estimators (`gae`, `bilevel_gae`, `turn_gae`; see `starpo_trl.algorithms.critic`).

    Parameters:
        critic_type (`str`, `"full"`): `full` (a copy of the policy) or `lora` (a second LoRA
            adapter on the policy's base; needs PEFT).
        critic_learning_rate (`float`, 1e-5), value_clip (`float`, 0.5), critic_warmup_steps (`int`,
            0: steps that train only the critic).
        whiten_advantages (`bool`, True): whiten the per-token advantages over the model tokens of the
            whole kept batch (all processes) before the loss: `(A - mean) / std`, as RAGEN, VAGEN and verl
            do. GRPO / RLOO advantages are not touched.
        value_loss_tokens (`str`, `"all"`): where the critic is trained: `all` model tokens (each with
            its return), or `turn_ends` (only each turn's last model token, whose target is the turn
            return `G_k`, as VAGEN trains its critic). Explained variance is logged on the same tokens.
        critic_epochs (`int`, 1): passes of the critic over each rollout batch (PPO's value
            epochs), each in a new random order and split into `steps_per_generation` micro-batches;
            they run before the policy's update, whatever `num_iterations` is.
    """

    critic_type: str = field(
        default="full", metadata={"help": "full (copy of the policy) or lora (value adapter, needs PEFT)."}
    )
    critic_learning_rate: float = field(default=1e-5, metadata={"help": "Critic learning rate."})
    value_clip: float | None = field(default=0.5, metadata={"help": "Value clipping range (None: no clipping)."})
    critic_warmup_steps: int = field(default=0, metadata={"help": "First steps train only the critic."})
    whiten_advantages: bool = field(
        default=True, metadata={"help": "Whiten critic advantages over the batch's model tokens."}
    )
    value_loss_tokens: str = field(
        default="all", metadata={"help": "Critic trained on all model tokens or only turn_ends."}
    )
    critic_epochs: int = field(
        default=1, metadata={"help": "Critic passes over each rollout batch, in shuffled micro-batches."}
    )

    def check_critic(self) -> None:
        """The rules among these settings (ranges: ``CRITIC_RANGES``)."""
        if self.value_loss_tokens not in ("all", "turn_ends"):
            raise ValueError(f"value_loss_tokens must be 'all' or 'turn_ends', got {self.value_loss_tokens!r}")
        if self.critic_type not in ("full", "lora"):
            raise ValueError(f"critic_type must be full or lora, got {self.critic_type!r}")
        if not self.critic_learning_rate > 0:
            raise ValueError(f"critic_learning_rate must be positive, got {self.critic_learning_rate}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"value_clip must be positive (or None for no clipping), got {self.value_clip}")
        if self.critic_warmup_steps < 0:
            raise ValueError(f"critic_warmup_steps must be >= 0, got {self.critic_warmup_steps}")
        if self.critic_epochs < 1:
            raise ValueError(f"critic_epochs must be at least 1, got {self.critic_epochs}")


@dataclass
class ScoringSettings(FilterSettings, AdvantageSettings):
    """What scoring a rollout reads (``starpo_trl.algorithms.scoring.score_rollout``): the filter's settings and
    the advantages'."""


FILTER_RANGES = {
    "rollout_filter_ratio": Range(0, low_open=True),
    "rollout_filter_eps": Range(0),
    **dict.fromkeys(
        ("rollout_filter_empty_stop_steps", "rollout_filter_max_rounds", "rollout_filter_refill_groups"), Range(1)
    ),
}
ADVANTAGE_RANGES = {
    **dict.fromkeys(("gamma", "lam", "turn_gamma", "turn_lambda"), Range(0, 1)),
    "step_advantage_weight": Range(0),
    "env_failure_reward": Range(),
}
CRITIC_RANGES = {
    "critic_learning_rate": Range(0, low_open=True),
    "value_clip": Range(0, low_open=True),
    "critic_warmup_steps": Range(0),
    "critic_epochs": Range(1),
}
check_declared(FilterSettings, FILTER_RANGES)
check_declared(AdvantageSettings, ADVANTAGE_RANGES)
check_declared(CriticSettings, CRITIC_RANGES)
