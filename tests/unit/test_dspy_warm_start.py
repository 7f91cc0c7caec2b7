"""examples/agent_libraries/dspy_prepare.py, the warm start the DSPy recipe trains from (tests/e2e/
test_agent_libraries.py): its SFT rows are the calls DSPy's ReAct makes, with replies DSPy parses back, and its
tokenizer reads and writes DSPy's text exactly, its fixed text a token per line or marker."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPLIES = [
    {"next_thought": "add", "next_tool_name": "add", "next_tool_args": {"a": 123, "b": 456}},
    {"next_thought": "done", "next_tool_name": "finish", "next_tool_args": {}},
    {"reasoning": "from add", "answer": "579"},
]


@pytest.fixture(scope="module")
def dspy_prepare():
    spec = importlib.util.spec_from_file_location("dspy_prepare", ROOT / "examples/agent_libraries/dspy_prepare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rows_are_the_calls_dspy_makes_with_replies_it_parses(dspy_prepare):
    import dspy

    rows = dspy_prepare.calls("123+456=", REPLIES)
    assert [[m["role"] for m in row["messages"]] for row in rows] == [["system", "user", "assistant"]] * 3
    react = dspy_prepare.dspy_agent.calculator
    signatures = [react.react.signature] * 2 + [react.extract.predict.signature]
    for row, signature, reply in zip(rows, signatures, REPLIES, strict=True):
        assert "[[ ## question ## ]]\n123+456=" in row["messages"][1]["content"]
        assert row["messages"][-1]["content"].endswith("[[ ## completed ## ]]\n")
        assert dspy.ChatAdapter().parse(signature, row["messages"][-1]["content"]) == reply
    assert "[[ ## observation_0 ## ]]\n579" in rows[1]["messages"][1]["content"]  # the tool ran on the model's args


def test_the_tokenizer_reads_dspy_prompts_of_both_adapters_exactly_and_briefly(dspy_prepare, tmp_path):
    """Every call's prompt (and DSPy's JSONAdapter fallback prompt, whose fixed lines are tokens too) and reply
    round-trip through the tokenizer without an unknown token, each in a few hundred positions where characters
    would take thousands."""
    import dspy
    from transformers import AutoTokenizer

    rng = random.Random(0)
    rows = [row for _ in range(8) for row in dspy_prepare.conversations(rng.randint(100, 999), 456, rng)]
    dspy_prepare.build_model(tmp_path, rows)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    react = dspy_prepare.dspy_agent.calculator
    fallback = dspy.JSONAdapter().format(react.react.signature, [], {"question": "123+456=", "trajectory": ""})
    for messages in [row["messages"] for row in rows] + [fallback]:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text and tokenizer.unk_token_id not in ids
        assert len(ids) < min(300, len(text) / 5)
