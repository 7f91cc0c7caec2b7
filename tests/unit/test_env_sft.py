"""`relayrl sft` on multi-turn `messages` rows: only assistant tokens are trained, and the ids are the ones a
multi-turn rollout builds (so the warm start learns exactly what RL continues)."""

from __future__ import annotations

import json

import pytest

from relayrl.data.chat import ChatCodec
from relayrl.errors import DataError
from relayrl.learner.sft import collate
from relayrl.learner.sft_chat import conversation_rows, encode_conversation, encode_conversations
from tests.unit.test_tito import chat_tokenizer

CONVERSATION = [
    {"role": "user", "content": "what is 2+3?"},
    {"role": "assistant", "content": "<calc>2+3</calc>"},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "5"},
]


@pytest.mark.parametrize("style", ["qwen", "llama3"])
def test_assistant_tokens_only_and_the_rollouts_ids(style):
    tokenizer = chat_tokenizer(style)
    ids, trained = encode_conversation(CONVERSATION, ChatCodec(tokenizer))
    rendered = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    eos = tokenizer.eos_token
    # the same text as the template's, up to the end-of-turn token the model stops at
    assert tokenizer.decode(ids) == rendered[: rendered.rindex(eos) + len(eos)]
    trained_text = tokenizer.decode([t for t, m in zip(ids, trained) if m])
    assert trained_text == f"<calc>2+3</calc>{eos}5{eos}"
    _, _, labels = collate([(ids, trained)], tokenizer.pad_token_id)
    assert (labels[0] != -100).sum() == sum(trained)


def test_rows_are_checked(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DataError, match="sft.jsonl:1: 'messages' must open with a non-assistant turn"):
        conversation_rows(path)
    path.write_text(json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n")
    assert conversation_rows(path) is None
    path.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    assert len(encode_conversations(conversation_rows(path), chat_tokenizer("qwen"))) == 1


def test_a_tiny_warm_start_on_conversations(tmp_path):
    from relayrl.learner.sft import SFTSettings, run_sft

    path = tmp_path / "sft.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"{a}+1="}, {"role": "assistant", "content": "9"}]} for a in range(8)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = SFTSettings(epochs=1, batch_size=8, hidden=32, layers=1)
    out = run_sft(path, tmp_path / "model", settings=settings, log=lambda *_: None)
    assert (out / "config.json").exists()


def test_a_rows_tools_are_rendered_by_the_template_as_an_agents_are(tmp_path):
    """TRL's conversational rows carry `tools`: the first prompt renders them (as an agent's `tools=` call does),
    so the warm start sees the prompt RL will."""
    from tests.unit.agent_harness import ADD, tool_tokenizer

    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"messages": CONVERSATION, "tools": [ADD]}) + "\n")
    ((where, messages, tools),) = conversation_rows(path) or []
    tokenizer = tool_tokenizer()
    ids, trained = encode_conversation(messages, ChatCodec(tokenizer), tools)
    assert where.endswith("sft.jsonl:1") and tools == [ADD]
    assert tokenizer.decode(ids).startswith("<|im_start|>system\nadd;<|im_end|>\n<|im_start|>user\nwhat is 2+3?")
    path.write_text(json.dumps({"messages": CONVERSATION, "tools": [{"name": "add"}]}) + "\n")
    with pytest.raises(DataError, match=r"sft.jsonl:1: 'tools' must be a list of \{type: function"):
        conversation_rows(path)
