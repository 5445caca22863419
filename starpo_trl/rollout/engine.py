"""The episode engine: many text-env episodes at once, token in, token out.

For a batch of start states it resets the envs, then per turn:

1. collects the token sequences of every still-active episode and generates all of them in ONE
   batched call of the generation backend;
2. appends the sampled token ids verbatim (env mask 1, with their sampling logprobs);
3. parses ``<think>...</think><answer>...</answer>`` (after ``reply_prefix``, the text the prompt
   opened the reply with, if any), splits the answer on ``||`` and steps the env within the action
   budgets;
4. appends the next user message (reward, state) as tokens rendered by the chat template for that
   message alone (env mask 0).

History is never re-rendered or re-tokenized, so the tokens the loss sees are exactly the tokens
that were sampled. The engine needs no Trainer: give it a tokenizer and a backend.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

from tqdm.auto import tqdm

from starpo_trl.rollout.chat_format import ChatFormat
from starpo_trl.rollout.env_runner import EnvCallError, EnvRunner
from starpo_trl.rollout.prompting import (
    SYSTEM_PROMPT,
    check_instruction_template,
    first_user_message,
    parse_reply,
    parse_tool_calls,
    shuffled_actions,
    turn_message,
)
from starpo_trl.rollout.settings import RolloutSettings
from starpo_trl.rollout.shaping import turn_shaping_reward


@dataclass(frozen=True)
class StartState:
    """One start state: an env id, its kwargs and a seed. A StarPO group shares one start state."""

    env_id: str
    seed: int
    env_kwargs: tuple = ()  # sorted (key, value) pairs, hashable


@dataclass
class Episode:
    """One finished trajectory. ``completion_ids[i]`` was written by the model iff ``env_mask[i] == 1``."""

    start: StartState
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # sampling logprobs; 0.0 on env tokens
    turn_rewards: list[float] = field(default_factory=list)  # env reward + format penalty + shaping, per turn
    shaping_reward: float = 0.0  # the reasoning shaping included in turn_rewards
    turn_end_positions: list[int] = field(default_factory=list)  # index of each turn's last model token
    reply_starts: list[int] = field(default_factory=list)  # index of each turn's first model token
    success: bool = False
    done: bool = False  # the env terminated or truncated
    truncated: bool = False  # cut by a token cap
    num_actions: int = 0
    num_valid_actions: int = 0
    num_effective_actions: int = 0
    num_format_errors: int = 0
    env_error: str | None = None
    messages: list[dict] = field(default_factory=list)  # the conversation as text, for logs
    # with a context window: the tokens each turn's reply was sampled from (empty: the whole history,
    # prompt_ids + completion_ids up to the reply)
    turn_prompts: list[list[int]] = field(default_factory=list)
    # each turn's anchor state (GiGPO): the env's state_key() when it has one, else the observation text
    turn_states: list = field(default_factory=list)
    # per turn: the reply reached its token limit with neither an end-of-turn token nor a stop string
    turn_cut: list[bool] = field(default_factory=list)
    masked_turns: list[int] = field(default_factory=list)  # turns left out of the loss (overlong_turns: mask)

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))


class GenerationBackend(Protocol):
    def generate(
        self, sequences: list[list[int]], max_new_tokens: int, temperature: float
    ) -> list[tuple[list[int], list[float]]]:
        """Continue each token sequence; return ``(new token ids, their sampling logprobs)`` per sequence.

        Generation of a sequence stops after an end-of-turn token, which is included. A backend that
        sets ``stops_rows = True`` also takes ``done(i, ids)`` and stops row ``i`` once it holds.
        """
        ...


@dataclass
class RolloutConfig(RolloutSettings):
    """The episode engine's settings: ``RolloutSettings`` (how an episode is played) plus the sampling temperature
    of training, the default of ``RolloutEngine.run``."""

    temperature: float = 1.0

    @classmethod
    def of(cls, config) -> RolloutConfig:
        """From a ``StarPOConfig`` (or any object with the same field names): its rollout settings and
        ``temperature``."""
        return cls(**RolloutSettings.of(config).values(), temperature=config.temperature)


@dataclass
class _Live:
    """What one episode's run keeps between turns (local to one ``run``)."""

    env: object = None
    obs: str = ""
    last_think: str | None = None
    actions_left: int = 0
    observations: list[str] = field(default_factory=list)  # the observation before each turn
    tools: list[dict] | None = None  # tool_call format: the env's tool schemas
    tool_results: list[str] = field(default_factory=list)  # tool_call format: this turn's results, in call order
    order: list[str] | None = None  # shuffle_instruction_actions: the action names in this episode's format line


def holds_stop_string(tokenizer, ids: list[int], stop_strings) -> bool:
    """The text of ``ids`` (special tokens left out) holds one of ``stop_strings``."""
    if not stop_strings:
        return False
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return any(s in text for s in stop_strings)


def stop_index(tokenizer, ids: list[int], stop_strings) -> int:
    """How many of a reply's tokens to keep: up to and including the first token at which the reply's text
    holds one of ``stop_strings``; all of them when none occurs."""
    if not holds_stop_string(tokenizer, ids, stop_strings):
        return len(ids)
    return next(k for k in range(1, len(ids) + 1) if holds_stop_string(tokenizer, ids[:k], stop_strings))


def overlong_penalty(length: int, max_tokens: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong penalty for one reply of ``length`` tokens under a ``max_tokens`` budget: 0 up to
    ``max_tokens - buffer``, then falling linearly to ``-factor`` at ``max_tokens``; with no buffer, ``-factor`` on
    a reply that reached the budget."""
    if buffer <= 0:
        return -factor if length >= max_tokens else 0.0
    return -factor * min(1.0, max(0, length - (max_tokens - buffer)) / buffer)


def _reply_done(tokenizer, limits: list[int], stop_strings: tuple[str, ...], i: int, ids: list[int]) -> bool:
    """Row ``i``'s reply ``ids`` is complete: it reached its episode's token limit or its text holds a stop
    string (checked after every sampled token, so it first holds at the token ``stop_index`` keeps last)."""
    return len(ids) >= limits[i] or holds_stop_string(tokenizer, ids, stop_strings)


def _error_text(err: Exception) -> str:
    return str(err) if isinstance(err, EnvCallError) else f"{type(err).__name__}: {err}"


class Rollout(list):
    """The episodes of one ``RolloutEngine.run`` (a list), with the seconds that run spent
    generating and in env calls (``timings``: ``{"generate": s, "env": s}``)."""

    def __init__(self, episodes=(), timings: dict[str, float] | None = None):
        super().__init__(episodes)
        self.timings = timings if timings is not None else {"generate": 0.0, "env": 0.0}


def check_tokenizer(tokenizer, eos_token_ids, config: RolloutConfig, system_prompt: str | None = None) -> ChatFormat:
    """What the engine needs of the tokenizer alone, checked before any weights load (``load_model_and_tokenizer``)
    and again when an engine is built: the chat template extends token-exactly with the reply prefix
    (``ChatFormat``), and with ``action_format='tool_call'`` it renders tool calls. Returns the ``ChatFormat``."""
    check_instruction_template(config.format_instruction)
    reply_prefix = config.prefix_text()
    chat = ChatFormat(tokenizer, list(eos_token_ids), system_prompt, reply_prefix=reply_prefix)
    if config.action_format not in ("answer_tags", "tool_call"):
        raise ValueError(f"action_format must be 'answer_tags' or 'tool_call', got {config.action_format!r}")
    if config.action_format == "tool_call":
        from trl.chat_template_utils import supports_tool_calling

        if not supports_tool_calling(tokenizer):
            raise ValueError(
                "action_format='tool_call' needs a chat template that renders tool calls and tool results "
                "(Qwen2.5/3, Llama 3.1, ...); this tokenizer's does not. Use action_format='answer_tags'."
            )
        if config.window_turns() is not None:
            raise ValueError("action_format='tool_call' keeps the whole history: use context_window='full'.")
        if reply_prefix:
            raise ValueError(
                "reply_prefix opens <think>/<answer> replies: leave it empty with action_format='tool_call'."
            )
    return chat


class RolloutEngine:
    """Plays episodes with a generation backend: ``run(starts, temperature, backend=...)``.

    ``backend`` given here is the default of every ``run``; a trainer whose backend changes between
    rollouts (new weights, vLLM) passes it to each ``run`` instead. Everything of one run (envs,
    observations, budgets, timings) is local to that run; the engine keeps only its settings, the
    chat format and the env runner (worker processes, closed by ``close()``).
    """

    def __init__(
        self,
        tokenizer,
        backend: GenerationBackend | None,
        config: RolloutConfig,
        eos_token_ids: list[int],
        system_prompt: str | None = SYSTEM_PROMPT,
        reasoning_reward_fn=None,
    ):
        self.tokenizer = tokenizer
        self.reasoning_reward_fn = reasoning_reward_fn
        self.backend = backend
        self.config = config
        self.eos_token_ids = list(eos_token_ids)
        self.reply_prefix = config.prefix_text()
        self.chat = check_tokenizer(tokenizer, self.eos_token_ids, config, system_prompt)
        self.runner = EnvRunner(config.runner_mode(), config.env_step_timeout)

    def _open(self, start: StartState):
        """Make and reset one env (runs on the runner's threads): ``(env, obs, error)``."""
        env = None
        try:
            env = self.runner.make(start.env_id, dict(start.env_kwargs))
            obs, _ = env.reset(start.seed)
            return env, obs, None
        except Exception as err:  # an env that fails to reset ends only its own episode
            if env is not None:
                self._close(env)
            return None, "", f"reset: {_error_text(err)}"

    @staticmethod
    def _close(env) -> None:
        try:
            env.close()
        except Exception:  # a failing close loses nothing: the episode is already recorded
            pass

    def run(
        self,
        starts: list[StartState],
        temperature: float | None = None,
        backend: GenerationBackend | None = None,
        progress: bool = False,
    ) -> Rollout:
        """Play one episode per start state; ``progress`` shows a bar of finished episodes."""
        cfg = self.config
        temperature = cfg.temperature if temperature is None else temperature
        backend = backend if backend is not None else self.backend
        if backend is None:
            raise ValueError("RolloutEngine.run needs a generation backend: pass backend= here or to the engine.")
        if hasattr(backend, "reset"):  # a backend's kept state belongs to the weights of its last rollout
            backend.reset()
        timings = {"generate": 0.0, "env": 0.0}
        t0 = time.perf_counter()
        opened = self.runner.map(self._open, starts)
        timings["env"] += time.perf_counter() - t0
        episodes, live = self._start(starts, opened)
        bar = tqdm(total=len(episodes), desc="episodes", unit="ep", leave=False, disable=not progress)
        finished = 0
        for turn in range(1, cfg.max_turns + 1):
            active = [i for i, ep in enumerate(episodes) if not ep.done and not ep.truncated]
            active = [i for i in active if cfg.max_episode_tokens - len(episodes[i].completion_ids) > 0]
            bar.update(len(episodes) - len(active) - finished)
            finished = len(episodes) - len(active)
            bar.set_postfix(turn=turn)
            if not active:
                if getattr(backend, "collective", False):
                    # a collective backend (vLLM server mode) needs every process in every call
                    backend.generate([], max_new_tokens=0, temperature=temperature)
                    continue
                break
            texts = self._generate(
                [episodes[i] for i in active], [live[i] for i in active], backend, temperature, timings
            )
            t0 = time.perf_counter()
            rewards = self.runner.map(
                lambda job: self._act(episodes[job[0]], live[job[0]], job[1]), list(zip(active, texts))
            )
            timings["env"] += time.perf_counter() - t0
            for i, reward in zip(active, rewards):
                self._next_turn(episodes[i], live[i], turn, reward)
        bar.update(len(episodes) - finished)
        bar.close()
        t0 = time.perf_counter()
        self.runner.map(self._close, [state.env for state in live if state.env is not None])
        self.runner.release_threads()
        timings["env"] += time.perf_counter() - t0
        return Rollout(episodes, timings)

    def _start(self, starts: list[StartState], opened) -> tuple[list[Episode], list[_Live]]:
        """The episodes' first prompts (or their reset errors), and what each run keeps per episode."""
        cfg = self.config
        episodes, live = [], []
        copies = collections.Counter()  # how many episodes of each start state came before (kwargs may hold lists)
        for start, (env, obs, error) in zip(starts, opened):
            tools, order, key = None, None, (start.env_id, start.seed, repr(start.env_kwargs))
            if error is None and cfg.shuffle_instruction_actions and env.unwrapped.action_names:
                order = shuffled_actions(env.unwrapped.action_names, start.seed, copies[key])
            copies[key] += 1
            if error is None and cfg.action_format == "tool_call":
                tools = list(getattr(env.unwrapped, "tool_schemas", None) or [])
                content = obs  # the env's own opening text; the template lists the tools
                ep = Episode(start=start, prompt_ids=self.chat.prompt_ids(content, tools=tools))
                ep.messages.append({"role": "user", "content": content})
            elif error is None:
                content = first_user_message(
                    env, obs, cfg.max_actions_per_turn, cfg.max_turns, cfg.enable_think, cfg.format_instruction, order
                )
                ep = Episode(start=start, prompt_ids=self.chat.prompt_ids(content))
                ep.messages.append({"role": "user", "content": content})
            else:
                ep = Episode(start=start, prompt_ids=self.chat.prompt_ids("environment failed to reset"))
                ep.env_error, ep.done = error, True
            episodes.append(ep)
            live.append(
                _Live(
                    env=env,
                    obs=obs,
                    actions_left=cfg.max_actions_per_episode,
                    observations=[obs],
                    tools=tools,
                    order=order,
                )
            )
        return episodes, live

    def _generate(
        self, active: list[Episode], states: list[_Live], backend, temperature: float, timings: dict
    ) -> list[str]:
        """One batched generation call for the active episodes; appends each reply's tokens verbatim
        (mask 1, with their logprobs) and returns the replies as text.

        Each episode is limited by its own room only: the batch is generated to the largest limit
        and every reply cut to its episode's, so an episode's tokens do not depend on who shares its
        batch; a reply is also cut after its first stop string (``stop_strings``). A backend with
        ``stops_rows = True`` (the HF backend) also gets ``done(i, ids)``, true once row ``i``'s reply
        is complete by these two rules, to stop sampling a row (and the call) there. A backend with
        ``needs_envs = True`` (an expert that answers from the env's state, as the warm start's does)
        also gets ``turns``: each episode's env and actions left."""
        cfg = self.config
        extra = {"turns": [(s.env, s.actions_left) for s in states]} if getattr(backend, "needs_envs", False) else {}
        limits = [min(cfg.max_tokens_per_turn, cfg.max_episode_tokens - len(ep.completion_ids)) for ep in active]
        if getattr(backend, "stops_rows", False):
            extra["done"] = functools.partial(_reply_done, self.tokenizer, limits, tuple(cfg.stop_strings or ()))
        t0 = time.perf_counter()
        contexts = [self._context(ep, state) for ep, state in zip(active, states)]
        outputs = backend.generate(
            contexts,
            max_new_tokens=max(limits),
            temperature=temperature,
            **extra,
        )
        timings["generate"] += time.perf_counter() - t0
        texts = []
        for ep, context, limit, (ids, logps) in zip(active, contexts, limits, outputs):
            ids, logps = ids[:limit], logps[:limit]
            keep = stop_index(self.tokenizer, ids, cfg.stop_strings)
            cut = len(ids) >= limit and keep == len(ids) and not (ids and ids[-1] in self.eos_token_ids)
            cut = cut and not holds_stop_string(self.tokenizer, ids, cfg.stop_strings)
            ids, logps = ids[:keep], logps[:keep]
            ep.turn_cut.append(cut)
            if cut and cfg.overlong_turns == "mask":
                ep.masked_turns.append(len(ep.reply_starts))
            ep.reply_starts.append(len(ep.completion_ids))
            if cfg.window_turns() is not None:
                ep.turn_prompts.append(context)
            ep.completion_ids += ids
            ep.env_mask += [1] * len(ids)
            ep.logprobs += logps
            ep.turn_end_positions.append(len(ep.completion_ids) - 1)
            text = self.reply_prefix + self.tokenizer.decode(ids, skip_special_tokens=True)
            ep.messages.append({"role": "assistant", "content": text})
            texts.append(text)
        return texts

    def _context(self, ep: Episode, state: _Live) -> list[int]:
        """The tokens the model reads before its reply this turn. ``full``: the whole episode so far.
        ``window:K``: a fresh first message (instructions and the state K turns ago), then the last K
        turns' tokens as they were (replies verbatim, env messages as appended); the whole history
        while it holds K turns or fewer. ``single_turn``: a fresh first message with the current state."""
        k = self.config.window_turns()
        turn = len(ep.reply_starts)  # replies so far
        if k is None or turn <= k:
            return ep.prompt_ids + ep.completion_ids
        cfg = self.config
        first = turn - k  # the oldest turn in the window (0-based)
        head = self.chat.prompt_ids(
            first_user_message(
                state.env,
                state.observations[first],
                cfg.max_actions_per_turn,
                cfg.max_turns,
                cfg.enable_think,
                cfg.format_instruction,
                state.order,
            )
        )
        tail = ep.completion_ids[ep.reply_starts[first] :] if k else []
        return head + tail

    def _next_turn(self, ep: Episode, state: _Live, turn: int, reward: float) -> None:
        """Record the turn's reward (with the overlong penalty, if on); end the episode, or append the next
        user message as the chat template's tokens (mask 0; an end-of-turn token first when the reply was
        cut), or mark it truncated when that message would not fit in ``max_episode_tokens``."""
        cfg = self.config
        if cfg.overlong_turns == "penalty":
            reply = ep.turn_end_positions[-1] + 1 - ep.reply_starts[-1]
            reward += overlong_penalty(
                reply, cfg.max_tokens_per_turn, cfg.overlong_buffer, cfg.overlong_penalty_factor
            )
        ep.turn_rewards.append(reward)
        ended_by_eos = (
            ep.env_mask[-1] == 1 and ep.completion_ids[-1] in self.eos_token_ids if ep.completion_ids else False
        )
        if ep.done or turn == cfg.max_turns or state.actions_left <= 0:
            ep.done = True
            return
        if cfg.action_format == "tool_call":  # the tool results, as the template renders tool messages
            new = [{"role": "tool", "content": r} for r in state.tool_results]
            message_ids = self.chat.message_ids(new, tools=state.tools)
        else:
            actions_left = state.actions_left if self._named(state.env) else None
            content = turn_message(
                turn + 1,
                state.obs,
                actions_left,
                reward,
                cfg.enable_think,
                cfg.format_instruction,
                state.env,
                state.order,
            )
            new = [{"role": "user", "content": content}]
            message_ids = self.chat.message_ids(new[0])
        obs_ids = ([] if ended_by_eos else [self.eos_token_ids[0]]) + message_ids
        if len(ep.completion_ids) + len(obs_ids) >= cfg.max_episode_tokens:
            ep.truncated = True  # cut at a turn boundary: the next turn would not fit
            return
        ep.completion_ids += obs_ids
        ep.env_mask += [0] * len(obs_ids)
        ep.logprobs += [0.0] * len(obs_ids)
        ep.messages += new
        state.observations.append(state.obs)

    def close(self) -> None:
        """Stop the env worker processes, if any."""
        self.runner.close()

    @staticmethod
    def _named(env) -> bool:
        return env is not None and env.unwrapped.action_names is not None

    @staticmethod
    def _step(ep: Episode, state: _Live, action) -> tuple[float, dict] | None:
        """One env step of this episode: its reward and info, with the episode's counts, its state and
        (when the env ends it) its success and end updated; None when the env failed, slowed past its
        timeout or paid a non-finite reward: the episode then ends as an env error."""
        try:
            obs, r, terminated, truncated, info = state.env.step(action)
            r = float(r)
            if not math.isfinite(r):
                raise ValueError(f"non-finite reward {r!r}")
        except Exception as err:  # a failing, slow or NaN-paying env ends only this episode
            ep.env_error, ep.done = f"step: {_error_text(err)}", True
            return None
        state.obs = obs
        ep.num_actions += 1
        state.actions_left -= 1
        ep.num_valid_actions += bool(info.get("action_is_valid", True))
        ep.num_effective_actions += bool(info.get("action_is_effective", False))
        if terminated or truncated:
            ep.success = bool(info.get("success", False))
            ep.done = True
        return r, info

    def _act_tools(self, ep: Episode, state: _Live, text: str) -> float:
        """``tool_call`` format: run the reply's tool calls in order (each an env step; its result is the
        next tool message); a reply without a call is the final answer and ends the episode. A malformed
        call, an unknown tool or one that raises: an error result and the format penalty."""
        cfg = self.config
        parsed = parse_tool_calls(text)
        state.tool_results = [json.dumps({"error": e}) for e in parsed.errors]
        reward, format_error = 0.0, bool(parsed.errors)
        actions = parsed.calls[: min(cfg.max_actions_per_turn, state.actions_left)]
        if not parsed.calls and not parsed.errors:
            actions = [text]  # the final answer
        for action in actions:
            stepped = self._step(ep, state, action)
            if stepped is None:
                break
            reward += stepped[0]
            format_error |= not stepped[1].get("action_is_valid", True)
            if isinstance(action, dict):
                state.tool_results.append(str(state.obs))
            if ep.done:
                break
        if format_error:
            ep.num_format_errors += 1
            reward += cfg.format_penalty
        return reward

    @staticmethod
    def _state_key(state: _Live):
        """The state a turn starts from, as a hashable key: the env's ``state_key()`` where it defines one
        (exact), else the observation the model reads."""
        try:
            key = state.env.unwrapped.state_key()
            hash(key)
        except Exception:  # no such method, or an unhashable key: the observation text stands in
            key = None
        return str(state.obs) if key is None else key

    def _act(self, ep: Episode, state: _Live, text: str) -> float:
        """Parse one reply and step the env; return the turn reward (env rewards + format penalty).
        Runs on the runner's threads: it touches only this episode."""
        cfg = self.config
        ep.turn_states.append(self._state_key(state))
        if cfg.action_format == "tool_call":
            return self._act_tools(ep, state, text)
        env = state.env
        named = self._named(env)
        budget = min(cfg.max_actions_per_turn, state.actions_left) if named else 1
        parsed = parse_reply(text, cfg.enable_think, split_actions=named, max_actions=budget)
        reward, format_error = 0.0, not parsed.format_ok
        for action in parsed.actions:
            try:
                known = not named or env.unwrapped.match_action(action) is not None
            except Exception as err:  # a failing env ends only this episode
                ep.env_error, ep.done = f"step: {_error_text(err)}", True
                break
            if not known:
                format_error = True  # unknown action: dropped, penalised
                ep.num_actions += 1
                continue
            stepped = self._step(ep, state, action)
            if stepped is None:
                break
            reward += stepped[0]
            if not named and not stepped[1].get("action_is_valid", True):
                format_error = True
            if ep.done:
                break
        if format_error:
            ep.num_format_errors += 1
            reward += cfg.format_penalty
        if cfg.enable_think and (cfg.shapes_think or self.reasoning_reward_fn is not None):
            shaping = turn_shaping_reward(
                parsed.think,
                parsed.answer,
                state.last_think,
                ep.num_turns + 1,
                cfg,
                self.reasoning_reward_fn,
            )
            ep.shaping_reward += shaping
            reward += shaping
        state.last_think = parsed.think
        return reward
