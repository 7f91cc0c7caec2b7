"""Token in, token out on two chat-template styles built locally (Llama-3 and Qwen), and a template that rewrites
earlier turns: observations are tokenised once as the template's delta, separators the model did not emit are
restored, and the concatenated ids equal the template's own render of the whole conversation."""

from __future__ import annotations

import pytest

from relayrl.data.chat import ChatCodec

QWEN = (
    "{% for m in messages %}{% if m['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' "
    "+ m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# Qwen3-style: an assistant turn before the last user turn loses its <think>...</think> part
DROPS_THINKING = (
    "{% set ns = namespace(last_user=0) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% set c = m['content'] %}"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in c %}"
    "{% set c = c.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = {"qwen": ["<|im_start|>", "<|im_end|>"], "llama3": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
TEXT = "abcdefghijklmnopqrstuvwxyz0123456789 +-*/=<>()_:,.!?\n" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def chat_tokenizer(style: str):
    """A character tokenizer with the style's special tokens and template; EOS is the end-of-turn token."""
    from tokenizers import Regex, pre_tokenizers

    from relayrl.models.tiny import train_char_tokenizer

    tokenizer = train_char_tokenizer([TEXT])
    # one token per character, newlines included (tiny.py's "." split leaves "\n\n" as one unknown piece)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    specials = SPECIAL["llama3" if style == "llama3" else "qwen"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.eos_token = "<|eot_id|>" if style == "llama3" else "<|im_end|>"
    tokenizer.chat_template = {"qwen": QWEN, "llama3": LLAMA3, "drops": DROPS_THINKING}[style]
    return tokenizer


def _converse(codec: ChatCodec, turns: list[tuple[str, bool, dict]]):
    """Drive a conversation: each turn is (model text, whether it ended with EOS, the observation after it).
    Returns the concatenated ids and the messages."""
    messages = [{"role": "user", "content": "what is 2+3?"}]
    _, ids = codec.first_prompt(messages)
    for text, eos, observation in turns:
        generated = codec.encode(text) + ([codec.tokenizer.eos_token_id] if eos else [])
        ids = ids + generated
        messages.append({"role": "assistant", "content": codec.action_text(generated)})
        delta = codec.observation(messages, generated, observation)
        assert delta.prefix_ok
        ids = ids + delta.token_ids
        messages.append(observation)
    return ids, messages


@pytest.mark.parametrize("style", ["qwen", "llama3"])
@pytest.mark.parametrize("eos", [True, False], ids=["eos", "stop-string"])
def test_concatenated_ids_equal_the_templates_render_of_the_whole_conversation(style, eos):
    codec = ChatCodec(chat_tokenizer(style))
    turns = [
        ("<calc>2+3</calc>", False, {"role": "tool", "content": "5"}),
        ("it is 6", eos, {"role": "user", "content": "wrong, again:"}),
        ("5", eos, {"role": "user", "content": "ok"}),
    ]
    ids, messages = _converse(codec, turns)
    rendered = codec.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert codec.tokenizer.decode(ids) == rendered  # separators restored: nothing missing, nothing doubled
    assert ids == codec.encode(rendered)


def test_the_missing_part_of_the_end_of_turn_suffix_is_restored():
    codec = ChatCodec(chat_tokenizer("qwen"))
    assert codec.assistant_suffix == "<|im_end|>\n"
    assert codec.missing_suffix("answer<|im_end|>") == "\n"  # EOS emitted, the newline is not
    assert codec.missing_suffix("<calc>1</calc>") == "<|im_end|>\n"  # stopped by a stop string
    assert ChatCodec(chat_tokenizer("llama3")).missing_suffix("x<|eot_id|>") == ""


def test_a_template_that_drops_earlier_thinking_is_detected():
    codec = ChatCodec(chat_tokenizer("drops"))
    messages = [{"role": "user", "content": "q"}]
    generated = codec.encode("<think>hmm</think>4") + [codec.tokenizer.eos_token_id]
    messages.append({"role": "assistant", "content": codec.action_text(generated)})
    delta = codec.observation(messages, generated, {"role": "user", "content": "again"})
    assert not delta.prefix_ok
    assert "hmm" not in delta.full_text and delta.full_text.endswith("<|im_start|>assistant\n")


def test_without_a_template_turns_are_plain_text():
    tokenizer = chat_tokenizer("qwen")
    codec = ChatCodec(tokenizer, chat_template=False)
    text, ids = codec.first_prompt([{"role": "user", "content": "2+3="}])
    assert text == "2+3=" and codec.observation([], [], {"role": "user", "content": "no"}).token_ids == codec.encode(
        "no"
    )
