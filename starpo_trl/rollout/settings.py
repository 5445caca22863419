"""``RolloutSettings``: how an episode is played, in training and in held-out evaluation alike.

The one definition of these settings: ``StarPOConfig`` is composed from this class (the same flat names on
the command line and in recipes), the episode engine reads it (``RolloutConfig`` adds the sampling
temperature), training saves its values next to a trained model (``starpo_rollout.json``), and
``evaluate.py`` builds its flags from these fields and plays a model as it was trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from starpo_trl.numeric_settings import Range, check_declared
from starpo_trl.rollout.env_runner import RUNNERS
from starpo_trl.rollout.prompting import names_fields, resolve_reply_prefix
from starpo_trl.settings_base import Settings

ACTION_FORMATS = ("answer_tags", "tool_call")
OVERLONG_MODES = ("keep", "mask", "penalty")
# the episode budgets: each at least 1
EPISODE_BUDGETS = (
    "max_turns",
    "max_actions_per_turn",
    "max_actions_per_episode",
    "max_tokens_per_turn",
    "max_episode_tokens",
)


def context_window_turns(value: str) -> int | None:
    """``full`` -> None, ``single_turn`` -> 0, ``window:K`` -> K (K >= 1); anything else is refused."""
    if value == "full":
        return None
    if value == "single_turn":
        return 0
    head, _, k = str(value).partition(":")
    if head == "window" and k.isdigit() and int(k) >= 1:
        return int(k)
    raise ValueError(f"context_window must be 'full', 'window:K' (K >= 1) or 'single_turn', got {value!r}")


@dataclass
class RolloutSettings(Settings):
    r"""
    How an episode is played (training and held-out evaluation).

    Parameters:
        max_turns (5), max_actions_per_turn (5), max_actions_per_episode (10): the action budgets.
        max_tokens_per_turn (`int`, 256): cap on tokens generated in one turn.
        max_episode_tokens (`int`, 2048): cap on completion tokens (model + env) of one episode;
            an episode that would pass it is cut at a turn boundary.
        context_window (`str`, `"full"`): what the model reads at each turn: `full` (the whole
            history), `window:K` (a fresh first message with the state K turns ago, then the last K
            turns' tokens as they were), `single_turn` (a fresh first message with the current state
            only). With a window each turn is its own training row (the tokens it was sampled from,
            then the reply), carrying its trajectory's advantage (with a critic: its own per-token
            advantages, from values on that row's context and GAE over the episode's replies in
            turn order); the loss must divide by the batch's model tokens (`loss_type` dapo, the
            default).
        action_format (`str`, `"answer_tags"`): how a reply acts. `answer_tags`:
            `<think>...</think><answer>...</answer>`, the answer split into actions. `tool_call`: the
            reply's tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the format of
            Qwen/Hermes templates), each run by the env, their results appended as the template's tool
            messages (env tokens); a reply without a call is the final answer and ends the episode. For
            TRL-style environment classes (`envs.trl_env.register_trl_environment`); malformed calls
            and unknown tools get the format penalty. Needs a template that renders tool calls.
        enable_think (`bool`, True): ask for `<think>...</think><answer>...</answer>`.
        reply_prefix (`str`, `""`): text every reply starts with, written into the prompt after the
            template's assistant header (env tokens: not sampled, not trained); the parser reads it
            with the reply. `auto`: `<think>` with `enable_think`, else `<answer>`, the opening tag
            RAGEN forces on every reply; a model too small to find the format by itself then only
            has to continue it.
        format_instruction (`str` or `None`): the line that ends every user message, in place of
            the paper's "Always output: <answer> [your answer] </answer> with no extra text."; may
            name `{example_action}` (the env's first action name) and `{actions}` (its action names:
            `{actions}` lists them, `{actions[i]}` names one), for envs with named actions.
        shuffle_instruction_actions (`bool`, False): each episode's format line shows the actions in an
            order of its own (`{actions}` in that order, `{example_action}` its first), drawn from the
            episode's start seed and its place among the episodes of that start in the rollout (each
            episode of a group draws its own), the same on every run; in training and evaluation alike.
            The line then favours no action by its position, and says nothing of which is right.
            Needs a `format_instruction` that names `{actions}` or `{example_action}`.
        stop_strings (`list[str]` or `None`): a reply ends with the first token that completes one of
            these in its text (kept, as vLLM's `include_stop_str_in_output`); what was sampled after
            it is dropped and the turn closed with the end-of-turn token, as a reply cut at
            `max_tokens_per_turn` is. `["</answer>"]` stops a model that goes on writing after its
            answer (text the loss and an entropy bonus would otherwise see).
        format_penalty (`float`, -0.1): added to a turn's reward when its reply is unparseable or
            names an unknown action.
        overlong_turns (`str`, `"keep"`): a reply that reached its token limit with neither an
            end-of-turn token nor a stop string (logged as `rollout/cut_turn_fraction`) is trained as any
            other (`keep`, TRL's default), left out of the loss (`mask`, TRL's `mask_truncated_completions`
            per turn), or penalised (`penalty`: DAPO's soft overlong penalty per turn, 0 up to
            `max_tokens_per_turn - overlong_buffer` reply tokens, then falling linearly to
            `-overlong_penalty_factor` at the limit; with `overlong_buffer` 0 the whole factor on a reply
            that reached the limit).
        eval_temperature (`float`, 0.5): sampling temperature of held-out evaluation.
        env_step_timeout (`float` or `None`): seconds an env reset/step may take; a slower one ends
            its episode and its worker process is killed (needs `env_runner="processes"`, the default
            when a timeout is set). `None`: no limit.
        env_runner (`str` or `None`): where env calls run (`starpo_trl.rollout.env_runner`): `inline` (in the
            trainer's process, one episode after another), `threads` (the episodes of a turn stepped
            concurrently on threads: I/O-bound envs), `processes` (each env in a worker process, stepped
            concurrently; a call past `env_step_timeout` kills its worker). `None`: `processes` when
            `env_step_timeout` is set, else `inline`.
        think_bonus (`float`, 0.0): reasoning-aware reward shaping (off by default): added to a turn whose
            think text has between `think_min_words` (1) and `think_max_words` (100) words.
        think_copy_penalty (`float`, 0.0): subtracted from a turn whose think text repeats the
            previous turn's verbatim (whitespace-normalised).
    """

    max_turns: int = field(default=5, metadata={"help": "Maximum turns per episode."})
    max_actions_per_turn: int = field(default=5, metadata={"help": "Maximum actions executed per turn."})
    max_actions_per_episode: int = field(default=10, metadata={"help": "Maximum actions executed per episode."})
    max_tokens_per_turn: int = field(default=256, metadata={"help": "Maximum tokens generated in one turn."})
    max_episode_tokens: int = field(
        default=2048, metadata={"help": "Maximum completion tokens (model + env) per episode."}
    )
    context_window: str = field(
        default="full", metadata={"help": "What each turn reads: full, window:K or single_turn."}
    )
    action_format: str = field(
        default="answer_tags", metadata={"help": "How a reply acts: answer_tags or tool_call (TRL-style envs)."}
    )
    enable_think: bool = field(default=True, metadata={"help": "Ask for <think>...</think><answer>...</answer>."})
    reply_prefix: str = field(
        default="",
        metadata={"help": "Text every reply starts with, given in the prompt; auto: <think> or <answer>."},
    )
    format_instruction: str | None = field(
        default=None,
        metadata={
            "help": "The format line ending each user message (may name {example_action}, {actions}); None: the paper's."
        },
    )
    shuffle_instruction_actions: bool = field(
        default=False,
        metadata={"help": "Each episode's format line lists {actions} (and takes {example_action}) in its own order."},
    )
    stop_strings: list[str] | None = field(
        default=None, metadata={"help": "A reply ends after the first of these it writes (kept), e.g. </answer>."}
    )
    format_penalty: float = field(
        default=-0.1, metadata={"help": "Reward added to a turn with an unparseable reply or unknown action."}
    )
    overlong_turns: str = field(
        default="keep",
        metadata={"help": "A reply cut by its token limit: keep (trained as any), mask (out of the loss) or penalty."},
    )
    overlong_buffer: int = field(
        default=0,
        metadata={"help": "penalty: the last this many tokens of max_tokens_per_turn ramp it to the factor."},
    )
    overlong_penalty_factor: float = field(
        default=1.0, metadata={"help": "penalty: the most subtracted from a turn's reward (DAPO's soft overlong)."}
    )
    eval_temperature: float = field(default=0.5, metadata={"help": "Sampling temperature for held-out evaluation."})
    env_step_timeout: float | None = field(
        default=None, metadata={"help": "Seconds an env reset/step may take (None: no limit)."}
    )
    env_runner: str | None = field(
        default=None,
        metadata={"help": "inline, threads or processes (None: processes with env_step_timeout, else inline)."},
    )
    think_bonus: float = field(
        default=0.0, metadata={"help": "Reward for a think text within the word bounds (0: off)."}
    )
    think_min_words: int = field(default=1, metadata={"help": "Fewest words of a think text that earns think_bonus."})
    think_max_words: int = field(default=100, metadata={"help": "Most words of a think text that earns think_bonus."})
    think_copy_penalty: float = field(
        default=0.0, metadata={"help": "Penalty for repeating the previous turn's think verbatim (0: off)."}
    )

    def prefix_text(self) -> str:
        """The reply prefix as text (``auto`` resolved)."""
        return resolve_reply_prefix(self.reply_prefix, self.enable_think)

    def window_turns(self) -> int | None:
        """None for ``full``, else how many earlier turns the prompt keeps (``single_turn``: 0)."""
        return context_window_turns(self.context_window)

    @property
    def rows_per_turn(self) -> bool:
        """Whether each turn is its own training row (a context window) rather than each episode one row: the one
        place the trainer, the critic's targets and the batch layout check learn the row layout from."""
        return self.window_turns() is not None

    def runner_mode(self) -> str:
        """Where env calls run, ``env_runner`` resolved."""
        if self.env_runner is not None:
            return self.env_runner
        return "processes" if self.env_step_timeout is not None else "inline"

    @property
    def shapes_think(self) -> bool:
        """Whether the reasoning shaping (``think_bonus`` / ``think_copy_penalty``) is on."""
        return self.think_bonus != 0.0 or self.think_copy_penalty != 0.0

    def check_rollout(self) -> None:
        """The rules among these settings; each value's kind and range is checked with ``ROLLOUT_RANGES``."""
        for name in EPISODE_BUDGETS:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        self.window_turns()  # a bad value fails here, naming the forms
        if self.action_format not in ACTION_FORMATS:
            raise ValueError(f"action_format must be 'answer_tags' or 'tool_call', got {self.action_format!r}")
        if self.action_format == "tool_call" and self.context_window != "full":
            raise ValueError("action_format='tool_call' keeps the whole history: use context_window='full'.")
        if self.stop_strings is not None and (
            isinstance(self.stop_strings, str) or not all(isinstance(x, str) and x for x in self.stop_strings)
        ):
            raise ValueError(f"stop_strings must be a list of non-empty strings, got {self.stop_strings!r}")
        if self.shuffle_instruction_actions and not names_fields(self.format_instruction):
            raise ValueError(
                "shuffle_instruction_actions shuffles the actions a format_instruction names: give a format_instruction "
                "with {actions} or {example_action} (e.g. 'One of {actions}: <answer>{example_action}</answer>'), "
                "or leave shuffle_instruction_actions off."
            )
        if self.action_format == "tool_call" and self.reply_prefix:
            raise ValueError(
                "reply_prefix opens <think>/<answer> replies: leave it empty with action_format='tool_call'."
            )
        if self.overlong_turns not in OVERLONG_MODES:
            raise ValueError(f"overlong_turns must be keep, mask or penalty, got {self.overlong_turns!r}")
        if self.overlong_buffer > self.max_tokens_per_turn:
            raise ValueError(
                f"overlong_buffer={self.overlong_buffer} is more than max_tokens_per_turn={self.max_tokens_per_turn}: "
                "the penalty ramps over the last overlong_buffer tokens of a turn's budget."
            )
        if not self.eval_temperature >= 0 or not math.isfinite(self.eval_temperature):
            raise ValueError(f"eval_temperature must be >= 0 (0: greedy evaluation), got {self.eval_temperature}")
        if not self.format_penalty <= 0:
            raise ValueError(
                f"format_penalty is added to the turn's reward: give it <= 0 (e.g. -0.1), got {self.format_penalty}"
            )
        if self.env_step_timeout is not None and not (
            self.env_step_timeout > 0 and math.isfinite(self.env_step_timeout)
        ):
            raise ValueError(
                f"env_step_timeout must be a finite number of seconds > 0, or None for no limit, got {self.env_step_timeout}"
            )
        if self.env_runner is not None and self.env_runner not in RUNNERS:
            raise ValueError(f"env_runner must be one of {RUNNERS} (or unset), got {self.env_runner!r}")
        if self.env_step_timeout is not None and self.env_runner not in (None, "processes"):
            raise ValueError(
                f"env_step_timeout needs env_runner='processes' (got {self.env_runner!r}): a hung env call can only be stopped "
                "by killing its worker process. Leave env_runner unset or set it to processes."
            )
        if self.think_bonus < 0 or self.think_copy_penalty < 0:
            raise ValueError(
                "think_bonus and think_copy_penalty are magnitudes: give them >= 0 (the penalty is subtracted)."
            )
        if not 0 <= self.think_min_words <= self.think_max_words:
            raise ValueError(
                f"need 0 <= think_min_words <= think_max_words, got {self.think_min_words} and {self.think_max_words}"
            )


ROLLOUT_RANGES = {
    **dict.fromkeys(EPISODE_BUDGETS, Range(1)),
    **dict.fromkeys(
        ("eval_temperature", "think_bonus", "think_min_words", "think_max_words", "think_copy_penalty"), Range(0)
    ),
    "env_step_timeout": Range(0, low_open=True),
    "overlong_buffer": Range(0),
    "overlong_penalty_factor": Range(0),
    "format_penalty": Range(None, 0),
}
check_declared(RolloutSettings, ROLLOUT_RANGES)
