"""Token in, token out: how the turns of a multi-turn trajectory become token ids, once each.

The first prompt is rendered with the chat template (with the generation prompt). After that, the model's
tokens are kept exactly as the engine produced them, and each observation is tokenised once, as the
template's delta: render(history + [observation], generation prompt) minus render(history). The next turn's
prompt is the concatenation of all ids so far; the history is never re-tokenised.

Two things can go wrong, and both are handled here:
- separators: the template closes an assistant turn with a suffix (`<|im_end|>\n`, `<|eot_id|>`); the model
  may have emitted only part of it (EOS without the newline) or none (stopped by a stop string). The part
  it did not emit is restored at the head of the observation's tokens.
- templates that rewrite earlier turns (dropping an earlier turn's reasoning, keeping only the last N
  messages): render(history + [observation]) then does not start with render(history). `Delta.prefix_ok`
  is False and `Delta.full_text` holds the re-rendered history, for the caller's `env.tito` policy.
Without a chat template (or with data.chat_template=false) turns are plain text, concatenated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_SENTINEL = "\x00relayrl-assistant\x00"


@dataclass
class Delta:
    """An observation's tokens, or (prefix_ok False) the re-rendered text of the whole history."""

    token_ids: list[int]
    prefix_ok: bool
    full_text: str = ""
    text: str = ""  # the text `token_ids` encode (an observation's images are expanded from its placeholders)


class ChatCodec:
    """Render and tokenise turns for one tokenizer (its chat template, or plain text)."""

    def __init__(self, tokenizer, chat_template: bool = True):
        self.tokenizer = tokenizer
        self.templated = chat_template and tokenizer.chat_template is not None
        self.assistant_suffix = self._assistant_suffix() if self.templated else ""

    def render(self, messages: list[dict[str, Any]], generation_prompt: bool, tools: list | None = None) -> str:
        """The chat template's text (with `tools`, as an agent's call offers them: the template renders them)."""
        if not self.templated:
            return "".join(m["content"] for m in messages)
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def first_prompt(self, messages: list[dict[str, Any]], tools: list | None = None) -> tuple[str, list[int]]:
        """The first prompt's text and ids (a plain prompt gets the tokenizer's special tokens, e.g. BOS)."""
        text = self.render(messages, generation_prompt=True, tools=tools)
        return text, self.tokenizer(text, add_special_tokens=not self.templated)["input_ids"]

    def action_text(self, generated_ids: list[int]) -> str:
        """What the environment sees of a turn: the generated tokens decoded, special tokens left out."""
        return self.tokenizer.decode(generated_ids, skip_special_tokens=True)

    def observation(
        self,
        history: list[dict[str, Any]],
        generated_ids: list[int],
        observation: dict[str, Any] | list[dict[str, Any]],
        tools: list | None = None,
    ) -> Delta:
        """The tokens that follow the model's last turn (`history` ends with it, as text) up to and including
        the next generation prompt: the observation's message, or messages (an agent's tool results and more)."""
        if isinstance(observation, dict):
            observation = [observation]
        if not self.templated:
            text = "".join(m["content"] for m in observation)
            return Delta(self.encode(text), True, text=text)
        before = self.render(history, generation_prompt=False, tools=tools)
        after = self.render(history + observation, generation_prompt=True, tools=tools)
        if not after.startswith(before):
            return Delta([], False, after)
        emitted = self.tokenizer.decode(generated_ids, skip_special_tokens=False)
        text = self.missing_suffix(emitted) + after[len(before) :]
        return Delta(self.encode(text), True, text=text)

    def missing_suffix(self, emitted: str) -> str:
        """The part of the template's end-of-assistant-turn suffix that the model's text does not end with."""
        suffix = self.assistant_suffix
        for k in range(len(suffix), 0, -1):
            if emitted.endswith(suffix[:k]):
                return suffix[k:]
        return suffix

    def _assistant_suffix(self) -> str:
        """What the template writes after an assistant turn's content, read off a rendered sentinel turn."""
        text = self.render(
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}], generation_prompt=False
        )
        if _SENTINEL not in text:
            return ""
        return text[text.rindex(_SENTINEL) + len(_SENTINEL) :]
