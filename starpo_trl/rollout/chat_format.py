"""Token ids of chat messages appended to an ongoing conversation, from the tokenizer's own template."""

from __future__ import annotations

import json

from starpo_trl.rollout.prompting import SYSTEM_PROMPT


class ChatFormat:
    """Token ids of chat messages appended to an ongoing conversation, from the tokenizer's template.

    ``message_ids(msg)`` are the tokens that follow an assistant turn's end-of-turn token when ``msg``
    comes next, up to and including the next assistant header (then ``reply_prefix``'s tokens, when
    set): rendered once per message by diffing two renders of a short fixed conversation. Templates
    that rewrite earlier turns (not prefix-preserving) are patched with TRL's training template when
    one exists, else refused. ``prompt_ids`` ends with the prefix's tokens too.
    """

    PROBE = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": "probe"}]

    def __init__(
        self, tokenizer, eos_token_ids: list[int], system_prompt: str | None = SYSTEM_PROMPT, reply_prefix: str = ""
    ):
        self.tokenizer = tokenizer
        # text every assistant turn starts with, written after the template's assistant header (prompt side)
        self.reply_prefix = reply_prefix
        self.reply_prefix_ids = tokenizer(reply_prefix, add_special_tokens=False)["input_ids"] if reply_prefix else []
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.eos_token_ids = list(eos_token_ids)
        self.eos_texts = [tokenizer.convert_ids_to_tokens(i) for i in eos_token_ids]
        self.turn_end_id = None  # the end-of-turn token the template closes an assistant turn with (set by the probe)
        self.chat_template = None
        self._prefixes: dict[str, str] = {}  # tools JSON -> the probe's prefix rendered with those tools
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

    def _render(self, messages, add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template,
            tools=tools,
        )

    def _prefix_for(self, tools: list[dict] | None) -> str:
        """The probe conversation's render up to its assistant turn's end, with these tools (cached)."""
        key = None if not tools else json.dumps(tools, sort_keys=True)
        if key is None:
            return self._prefix
        if key not in self._prefixes:
            self._prefixes[key] = self._probe_prefix(tools)
        return self._prefixes[key]

    def _probe_prefix(self, tools: list[dict] | None = None) -> str:
        text = self._render(self.system + self.PROBE, add_generation_prompt=False, tools=tools)
        ends = [(text.rfind(e) + len(e), i) for i, e in zip(self.eos_token_ids, self.eos_texts) if text.rfind(e) >= 0]
        if not ends:
            raise ValueError(
                f"The chat template does not end an assistant turn with an end-of-turn token ({self.eos_texts}). "
                "Set the model's generation_config.eos_token_id to the token that closes an assistant turn."
            )
        end, self.turn_end_id = max(ends)
        return text[:end]

    def prompt_ids(self, user_content: str, tools: list[dict] | None = None) -> list[int]:
        """The first prompt (system, the user message, the assistant header); ``tools``: JSON schemas the
        template lists for tool calling."""
        messages = self.system + [{"role": "user", "content": user_content}]
        text = self._render(messages, add_generation_prompt=True, tools=tools)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + self.reply_prefix_ids

    def message_ids(self, message: dict | list[dict], tools: list[dict] | None = None) -> list[int]:
        """The tokens of ``message`` (or several in a row, e.g. tool results) after an assistant turn."""
        prefix = self._prefix_for(tools)
        messages = [message] if isinstance(message, dict) else list(message)
        full = self._render(self.system + self.PROBE + messages, add_generation_prompt=True, tools=tools)
        if not full.startswith(prefix):
            raise ValueError(
                "The chat template is not prefix-preserving: adding a message changes how earlier turns are "
                "rendered, so tokens sampled in turn t would not match the history of turn t+1. Use a "
                "prefix-preserving template (pass `chat_template=` to the tokenizer), e.g. TRL's training "
                "templates in trl/chat_templates/."
            )
        return self.tokenizer(full[len(prefix) :], add_special_tokens=False)["input_ids"] + self.reply_prefix_ids
