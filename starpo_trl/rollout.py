"""The episode engine: many text-env episodes at once, token in, token out.

For a batch of start states it resets the envs, then per turn:

1. collects the token sequences of every still-active episode and generates all of them in ONE
   batched call of the generation backend;
2. appends the sampled token ids verbatim (env mask 1, with their sampling logprobs);
3. parses ``<think>...</think><answer>...</answer>``, splits the answer on ``||`` and steps the
   env within the action budgets;
4. appends the next user message (reward, state) as tokens rendered by the chat template for that
   message alone (env mask 0).

History is never re-rendered or re-tokenized, so the tokens the loss sees are exactly the tokens
that were sampled. The engine needs no Trainer: give it a tokenizer and a backend.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
from tqdm.auto import tqdm

import envs  # noqa: F401  (registers the starpo/* env ids)

from starpo_trl.env_runner import EnvCallError, EnvRunner
from starpo_trl.prompting import SYSTEM_PROMPT, first_user_message, parse_reply, turn_message
from starpo_trl.shaping import ThinkShaping, turn_shaping_reward


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
    success: bool = False
    done: bool = False  # the env terminated or truncated
    truncated: bool = False  # cut by a token cap
    num_actions: int = 0
    num_valid_actions: int = 0
    num_effective_actions: int = 0
    num_format_errors: int = 0
    env_error: str | None = None
    messages: list[dict] = field(default_factory=list)  # the conversation as text, for logs

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))


class GenerationBackend(Protocol):
    def generate(self, sequences: list[list[int]], max_new_tokens: int, temperature: float) -> list[tuple[list[int], list[float]]]:
        """Continue each token sequence; return ``(new token ids, their sampling logprobs)`` per sequence.

        Generation of a sequence stops after an end-of-turn token, which is included.
        """
        ...


def sampling_config(max_new_tokens: int, temperature: float, eos_token_ids: list[int], pad_token_id: int):
    """A ``GenerationConfig`` that samples from exactly ``softmax(logits / temperature)``.

    Every logits processor a checkpoint's ``generation_config`` may bring (repetition penalty,
    top-k / top-p / min-p, typical / epsilon / eta cutoffs, n-gram blocking, a minimum length, ...)
    is set to its neutral value, because TRL's loss and the recorded sampling logprobs are
    ``log_softmax(logits / T)``: tokens drawn from any other distribution would carry wrong ratios.
    """
    from transformers import GenerationConfig

    greedy = temperature <= 0
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=not greedy, temperature=1.0 if greedy else temperature,
        top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, repetition_penalty=1.0,
        encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, renormalize_logits=False,
        eos_token_id=list(eos_token_ids), pad_token_id=pad_token_id, return_dict_in_generate=True,
    )


class HFBackend:
    """Generation with ``model.generate``, sampling at ``temperature`` from the plain softmax: no
    top-k/top-p, and none of the processors a checkpoint's ``generation_config`` sets
    (``sampling_config``; the model's own config is set aside during the call, so nothing of it
    fills the unset fields).

    Logprobs are ``log_softmax(logits / temperature)`` of the sampled tokens: the same quantity
    TRL's loss computes, so the importance ratio starts at exactly 1 on-policy.

    KV reuse across turns (``reuse_cache``, on for full-attention models): each call keeps, per
    sequence, the keys and values it computed (prompt, history and the new reply but its last
    token). A sequence of the next call that extends a kept one (same tokens, plus the reply's last
    token and the next observation) feeds only its new tokens; the kept rows are laid out right-aligned
    in one cache, the new tokens left-padded after it, and the attention mask hides the gaps, so each
    row sees exactly its own tokens at their own positions. The engine calls ``reset()`` at the start
    of every rollout: kept values belong to the weights they were computed with. With the same cache
    layout, identical new sequences (the copies of a start state in a group) are read once and shared.
    """

    def __init__(self, model, pad_token_id: int, eos_token_ids: list[int], reuse_cache: bool = True):
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.reuse_cache = reuse_cache and _full_attention(model)
        self.prefill_tokens = 0  # tokens run through the model before sampling, over all calls
        self._kept: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []

    def reset(self) -> None:
        self._kept = []

    def _match(self, sequences) -> list:
        """For each sequence, the kept entry it extends (in order: the engine keeps episode order), or None."""
        found, j = [], 0
        for seq in sequences:
            hit = None
            for k in range(j, len(self._kept)):
                tokens = self._kept[k][0]
                if len(tokens) < len(seq) and seq[: len(tokens)] == tokens:
                    hit, j = self._kept[k], k + 1
                    break
            found.append(hit)
        return found

    @torch.no_grad()
    def generate(self, sequences, max_new_tokens, temperature):
        from transformers import DynamicCache, GenerationConfig, LogitsProcessorList

        device = next(self.model.parameters()).device
        kept = self._match(sequences) if self.reuse_cache else [None] * len(sequences)
        if self.reuse_cache:
            kept = self._share_prompts(sequences, kept, device)
        cached = [0 if k is None else len(k[0]) for k in kept]
        suffixes = [seq[c:] for seq, c in zip(sequences, cached)]
        n, lc, ls = len(sequences), max(cached), max(len(x) for x in suffixes)
        input_ids = torch.full((n, ls), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((n, lc + ls), dtype=torch.long)
        for i, (c, suffix) in enumerate(zip(cached, suffixes)):
            input_ids[i, ls - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            attention_mask[i, lc - c : lc] = 1
            attention_mask[i, lc + ls - len(suffix) :] = 1
        self.prefill_tokens += sum(len(x) for x in suffixes)
        past = None
        if lc > 0:  # the kept rows, right-aligned in one cache; zeros (masked) on the left
            layers = []
            for layer, (k0, v0) in enumerate(next(k for k in kept if k is not None)[1]):
                keys = k0.new_zeros((n, k0.shape[0], lc, k0.shape[2]))
                values = v0.new_zeros((n, v0.shape[0], lc, v0.shape[2]))
                for i, (entry, c) in enumerate(zip(kept, cached)):
                    if entry is not None:
                        keys[i, :, lc - c :], values[i, :, lc - c :] = entry[1][layer]
                layers.append((keys.to(device), values.to(device)))
            past = DynamicCache(ddp_cache_data=layers)
        greedy = temperature <= 0
        was_training = self.model.training
        self.model.eval()
        own = self.model.generation_config
        self.model.generation_config = GenerationConfig()  # nothing of the checkpoint's sampling settings leaks in
        record = _SampledLogprobs(1.0 if greedy else temperature)
        try:
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                cache=past,
                generation_config=sampling_config(max_new_tokens, temperature, self.eos_token_ids, self.pad_token_id),
                logits_processor=LogitsProcessorList([record]),
            )
        finally:
            self.model.generation_config = own
        if was_training:
            self.model.train()
        new_tokens = out.sequences[:, ls:]
        logps = record.finish(new_tokens[:, -1])
        results = []
        eos = set(self.eos_token_ids)
        for row, lp in zip(new_tokens.tolist(), logps.tolist()):
            end = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
            results.append((row[:end], lp[:end]))
        if self.reuse_cache:
            self._keep(sequences, cached, suffixes, lc, ls, results, out.past_key_values)
        return results

    def _share_prompts(self, sequences, kept, device) -> list:
        """Identical new sequences (a group's ``num_generations`` copies of one start state) are read once.

        The keys and values of each distinct sequence but its last token come from one forward pass
        (left-padded, positions counted from each row's first token); every copy then starts from
        them as from a kept entry, feeding only its last token."""
        rows: dict[tuple, list[int]] = {}
        for i, (seq, entry) in enumerate(zip(sequences, kept)):
            if entry is None and len(seq) > 1:
                rows.setdefault(tuple(seq), []).append(i)
        shared = [seq for seq, members in rows.items() if len(members) > 1]
        if not shared:
            return kept
        width = max(len(seq) - 1 for seq in shared)
        input_ids = torch.full((len(shared), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(shared), width), dtype=torch.long)
        for r, seq in enumerate(shared):
            input_ids[r, width - len(seq) + 1 :] = torch.tensor(seq[:-1], dtype=torch.long)
            attention_mask[r, width - len(seq) + 1 :] = 1
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        was_training = self.model.training
        self.model.eval()
        out = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                         position_ids=position_ids.to(device), use_cache=True)
        if was_training:
            self.model.train()
        self.prefill_tokens += sum(len(seq) - 1 for seq in shared)
        layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        kept = list(kept)
        for r, seq in enumerate(shared):
            start = width - len(seq) + 1
            entry = (list(seq[:-1]), [(k[r, :, start:], v[r, :, start:]) for k, v in layers])
            for i in rows[seq]:
                kept[i] = entry
        return kept

    def _keep(self, sequences, cached, suffixes, lc, ls, results, cache) -> None:
        """Each row's own keys and values (its history and its reply but the last token), contiguous."""
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        kept = []
        for i, (seq, c, suffix, (ids, _)) in enumerate(zip(sequences, cached, suffixes, results)):
            if not ids:
                continue
            spans = [(lc - c, lc), (lc + ls - len(suffix), lc + ls), (lc + ls, lc + ls + len(ids) - 1)]
            rows = [(torch.cat([k[i, :, a:b] for a, b in spans], dim=1), torch.cat([v[i, :, a:b] for a, b in spans], dim=1)) for k, v in layers]
            kept.append((list(seq) + ids[:-1], rows))
        self._kept = kept


class _SampledLogprobs:
    """A logits processor that records ``log_softmax(logits / T)`` of each sampled token without
    keeping every step's logits: at step t it sees the token drawn at step t-1 and reads its
    logprob from the one distribution it kept (batch x vocab, not batch x steps x vocab: 13 GB for
    256 replies of 256 tokens over a 49k vocabulary). Custom processors run before the temperature
    warper, so ``scores`` are the raw logits here (every other processor is neutral)."""

    def __init__(self, scale: float):
        self.scale, self.previous, self.steps = scale, None, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, input_ids[:, -1:].to(self.previous.device)).squeeze(1))
        self.previous = torch.log_softmax(scores.float() / self.scale, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(B, new tokens) logprobs, given the tokens drawn at the last step."""
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, last_tokens[:, None].to(self.previous.device)).squeeze(1))
            self.previous = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(len(last_tokens), 0)


def _full_attention(model) -> bool:
    """Only caches of plain full-attention layers are laid out and cut here (no sliding windows)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    types = getattr(config, "layer_types", None) or ["full_attention"]
    return all(t == "full_attention" for t in types) and not getattr(config, "use_sliding_window", False)


class ChatFormat:
    """Token ids of chat messages appended to an ongoing conversation, from the tokenizer's template.

    ``message_ids(msg)`` are the tokens that follow an assistant turn's end-of-turn token when ``msg``
    comes next, up to and including the next assistant header: rendered once per message by
    diffing two renders of a short fixed conversation. Templates that rewrite earlier turns
    (not prefix-preserving) are patched with TRL's training template when one exists, else refused.
    """

    PROBE = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": "probe"}]

    def __init__(self, tokenizer, eos_token_ids: list[int], system_prompt: str | None = SYSTEM_PROMPT):
        self.tokenizer = tokenizer
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.eos_token_ids = list(eos_token_ids)
        self.eos_texts = [tokenizer.convert_ids_to_tokens(i) for i in eos_token_ids]
        self.turn_end_id = None  # the end-of-turn token the template closes an assistant turn with (set by the probe)
        self.chat_template = None
        try:
            self._prefix = self._probe_prefix()
            self.message_ids({"role": "user", "content": "check"})
        except ValueError as err:
            from trl.chat_template_utils import get_training_chat_template

            try:
                patched = get_training_chat_template(tokenizer)
            except ValueError:  # TRL has no training template for this one
                patched = None
            if patched is None:
                raise err from None
            self.chat_template = patched
            try:
                self._prefix = self._probe_prefix()
                self.message_ids({"role": "user", "content": "check"})
            except ValueError:
                raise err from None

    def _render(self, messages, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, chat_template=self.chat_template
        )

    def _probe_prefix(self) -> str:
        text = self._render(self.system + self.PROBE, add_generation_prompt=False)
        ends = [(text.rfind(e) + len(e), i) for i, e in zip(self.eos_token_ids, self.eos_texts) if text.rfind(e) >= 0]
        if not ends:
            raise ValueError(
                f"The chat template does not end an assistant turn with an end-of-turn token ({self.eos_texts}). "
                "Set the model's generation_config.eos_token_id to the token that closes an assistant turn."
            )
        end, self.turn_end_id = max(ends)
        return text[:end]

    def prompt_ids(self, user_content: str) -> list[int]:
        text = self._render(self.system + [{"role": "user", "content": user_content}], add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def message_ids(self, message: dict) -> list[int]:
        full = self._render(self.system + self.PROBE + [message], add_generation_prompt=True)
        if not full.startswith(self._prefix):
            raise ValueError(
                "The chat template is not prefix-preserving: adding a message changes how earlier turns are "
                "rendered, so tokens sampled in turn t would not match the history of turn t+1. Use a "
                "prefix-preserving template (pass `chat_template=` to the tokenizer), e.g. TRL's training "
                "templates in trl/chat_templates/."
            )
        return self.tokenizer(full[len(self._prefix) :], add_special_tokens=False)["input_ids"]


@dataclass
class RolloutConfig:
    max_turns: int = 5
    max_actions_per_turn: int = 5
    max_actions_per_episode: int = 10
    max_tokens_per_turn: int = 256
    max_episode_tokens: int = 2048  # completion tokens (model + env) of a whole episode
    enable_think: bool = True
    format_penalty: float = -0.1
    temperature: float = 1.0
    env_step_timeout: float | None = None  # seconds per env call (needs env_runner="processes")
    env_runner: str | None = None  # inline, threads or processes; None: processes with a timeout, else inline
    think_shaping: ThinkShaping = field(default_factory=ThinkShaping)  # reasoning reward shaping (off)

    def runner_mode(self) -> str:
        if self.env_runner is not None:
            return self.env_runner
        return "processes" if self.env_step_timeout is not None else "inline"


@dataclass
class _Live:
    """What one episode's run keeps between turns (local to one ``run``)."""

    env: object = None
    obs: str = ""
    last_think: str | None = None
    actions_left: int = 0


def _error_text(err: Exception) -> str:
    return str(err) if isinstance(err, EnvCallError) else f"{type(err).__name__}: {err}"


class RolloutEngine:
    def __init__(
        self, tokenizer, backend: GenerationBackend, config: RolloutConfig, eos_token_ids: list[int],
        system_prompt: str | None = SYSTEM_PROMPT, reasoning_reward_fn=None,
    ):
        self.tokenizer = tokenizer
        self.reasoning_reward_fn = reasoning_reward_fn
        self.backend = backend
        self.config = config
        self.eos_token_ids = list(eos_token_ids)
        self.chat = ChatFormat(tokenizer, self.eos_token_ids, system_prompt)
        self.runner = EnvRunner(config.runner_mode(), config.env_step_timeout)
        self.timings = {"generate": 0.0, "env": 0.0}
        self.progress = False  # a progress bar of finished episodes (the trainer turns it on on the main process)

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

    def run(self, starts: list[StartState], temperature: float | None = None) -> list[Episode]:
        cfg = self.config
        temperature = cfg.temperature if temperature is None else temperature
        if hasattr(self.backend, "reset"):  # a backend's kept state belongs to the weights of its last rollout
            self.backend.reset()
        episodes: list[Episode] = []
        live: list[_Live] = []
        t0 = time.perf_counter()
        opened = self.runner.map(self._open, starts)
        self.timings["env"] += time.perf_counter() - t0
        for start, (env, obs, error) in zip(starts, opened):
            if error is None:
                content = first_user_message(env, obs, cfg.max_actions_per_turn, cfg.max_turns, cfg.enable_think)
                ep = Episode(start=start, prompt_ids=self.chat.prompt_ids(content))
                ep.messages.append({"role": "user", "content": content})
            else:
                ep = Episode(start=start, prompt_ids=self.chat.prompt_ids("environment failed to reset"))
                ep.env_error, ep.done = error, True
            episodes.append(ep)
            live.append(_Live(env=env, obs=obs, actions_left=cfg.max_actions_per_episode))

        bar = tqdm(total=len(episodes), desc="episodes", unit="ep", leave=False, disable=not self.progress)
        finished = 0
        for turn in range(1, cfg.max_turns + 1):
            active = [i for i, ep in enumerate(episodes) if not ep.done and not ep.truncated]
            active = [i for i in active if cfg.max_episode_tokens - len(episodes[i].completion_ids) > 0]
            bar.update(len(episodes) - len(active) - finished)
            finished = len(episodes) - len(active)
            bar.set_postfix(turn=turn)
            if not active:
                if getattr(self.backend, "collective", False):
                    # a collective backend (vLLM server mode) needs every process in every call
                    self.backend.generate([], max_new_tokens=0, temperature=temperature)
                    continue
                break
            # each episode is limited by its own room only; the batch is generated to the largest
            # limit and every reply cut to its episode's, so an episode's tokens do not depend on
            # who shares its batch
            limits = [min(cfg.max_tokens_per_turn, cfg.max_episode_tokens - len(episodes[i].completion_ids)) for i in active]
            t0 = time.perf_counter()
            outputs = self.backend.generate(
                [episodes[i].prompt_ids + episodes[i].completion_ids for i in active],
                max_new_tokens=max(limits),
                temperature=temperature,
            )
            self.timings["generate"] += time.perf_counter() - t0
            texts = []
            for i, limit, (ids, logps) in zip(active, limits, outputs):
                ep = episodes[i]
                ids, logps = ids[:limit], logps[:limit]
                ep.completion_ids += ids
                ep.env_mask += [1] * len(ids)
                ep.logprobs += logps
                ep.turn_end_positions.append(len(ep.completion_ids) - 1)
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                ep.messages.append({"role": "assistant", "content": text})
                texts.append(text)
            t0 = time.perf_counter()
            rewards = self.runner.map(lambda job: self._act(episodes[job[0]], live[job[0]], job[1]), list(zip(active, texts)))
            self.timings["env"] += time.perf_counter() - t0
            for i, reward in zip(active, rewards):
                ep, state = episodes[i], live[i]
                ep.turn_rewards.append(reward)
                ended_by_eos = ep.env_mask[-1] == 1 and ep.completion_ids[-1] in self.eos_token_ids if ep.completion_ids else False
                if ep.done or turn == cfg.max_turns or state.actions_left <= 0:
                    ep.done = True
                    continue
                content = turn_message(turn + 1, state.obs, state.actions_left if self._named(state.env) else None, reward, cfg.enable_think)
                obs_ids = ([] if ended_by_eos else [self.eos_token_ids[0]]) + self.chat.message_ids({"role": "user", "content": content})
                if len(ep.completion_ids) + len(obs_ids) >= cfg.max_episode_tokens:
                    ep.truncated = True  # cut at a turn boundary: the next turn would not fit
                    continue
                ep.completion_ids += obs_ids
                ep.env_mask += [0] * len(obs_ids)
                ep.logprobs += [0.0] * len(obs_ids)
                ep.messages.append({"role": "user", "content": content})
        bar.update(len(episodes) - finished)
        bar.close()
        t0 = time.perf_counter()
        self.runner.map(self._close, [state.env for state in live if state.env is not None])
        self.timings["env"] += time.perf_counter() - t0
        return episodes

    def close(self) -> None:
        """Stop the env worker processes, if any."""
        self.runner.close()

    @staticmethod
    def _named(env) -> bool:
        return env is not None and env.unwrapped.action_names is not None

    def _act(self, ep: Episode, state: _Live, text: str) -> float:
        """Parse one reply and step the env; return the turn reward (env rewards + format penalty).
        Runs on the runner's threads: it touches only this episode."""
        cfg = self.config
        env = state.env
        named = self._named(env)
        budget = min(cfg.max_actions_per_turn, state.actions_left) if named else 1
        parsed = parse_reply(text, cfg.enable_think, split_actions=named, max_actions=budget)
        reward, format_error = 0.0, not parsed.format_ok
        for action in parsed.actions:
            try:
                if named and env.unwrapped.match_action(action) is None:
                    format_error = True  # unknown action: dropped, penalised
                    ep.num_actions += 1
                    continue
                obs, r, terminated, truncated, info = env.step(action)
                r = float(r)
                if not math.isfinite(r):
                    raise ValueError(f"non-finite reward {r!r}")
            except Exception as err:  # a failing, slow or NaN-paying env ends only this episode
                ep.env_error, ep.done = f"step: {_error_text(err)}", True
                break
            state.obs = obs
            ep.num_actions += 1
            state.actions_left -= 1
            reward += float(r)
            ep.num_valid_actions += bool(info.get("action_is_valid", True))
            ep.num_effective_actions += bool(info.get("action_is_effective", False))
            if not named and not info.get("action_is_valid", True):
                format_error = True
            if terminated or truncated:
                ep.success = bool(info.get("success", False))
                ep.done = True
                break
        if format_error:
            ep.num_format_errors += 1
            reward += cfg.format_penalty
        if cfg.enable_think and (cfg.think_shaping.enabled or self.reasoning_reward_fn is not None):
            shaping = turn_shaping_reward(
                parsed.think, parsed.answer, state.last_think, ep.num_turns + 1, cfg.think_shaping, self.reasoning_reward_fn
            )
            ep.shaping_reward += shaping
            reward += shaping
        state.last_think = parsed.think
        return reward
