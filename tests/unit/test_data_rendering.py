"""relayrl.data.source: what the model is shown — trailing assistant turns, the first-prompt line, null columns."""

from __future__ import annotations

import json
import string

import pytest

from relayrl.data.source import load_prompts, read_rows, show_first_prompt
from relayrl.errors import DataError
from relayrl.models.tiny import train_char_tokenizer

# A role-labelled template like most instruct models': "user: ...\n" per turn, "assistant: " to generate.
ROLE_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.fixture
def tokenizer():
    tok = train_char_tokenizer([string.printable])
    tok.chat_template = ROLE_TEMPLATE
    return tok


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path, rows):
    """Every column in every row, as a table stores them: a row without a column holds null there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {key: [row.get(key) for row in rows] for row in rows for key in row}
    pq.write_table(pa.Table.from_pydict(columns), path)
    return path


# ---------------------------------------------------------------------------- a trailing assistant turn


def test_trailing_assistant_message_is_continued_not_answered_again(tmp_path, tokenizer):
    messages = [{"role": "user", "content": "Add 3 and 6."}, {"role": "assistant", "content": "The sum is"}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages, "answer": "9"}])
    (prompt,), _ = load_prompts(path, tokenizer, 100)
    # as TRL renders a conversational prompt that ends with an assistant turn: the model continues it
    assert prompt.text == "user: Add 3 and 6.\nassistant: The sum is"
    assert "assistant: The sum is\n" not in prompt.text


def test_trailing_assistant_message_gets_no_end_of_turn_token(tmp_path):
    tok = train_char_tokenizer([string.printable])  # the tiny template closes an assistant turn with eos
    messages = [{"role": "user", "content": "5+6="}, {"role": "assistant", "content": "1"}]
    (prompt,), _ = load_prompts(write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}]), tok, 100)
    assert prompt.text == "5+6=1"
    assert tok.eos_token_id not in prompt.token_ids


def test_trailing_user_message_still_gets_the_generation_prompt(tmp_path, tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    (prompt,), _ = load_prompts(write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}]), tokenizer, 100)
    assert prompt.text == "user: hi\nassistant: "


def test_template_that_rewrites_the_final_assistant_message_names_the_row(tmp_path, tokenizer):
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | upper }}\n{% endfor %}"
    rows = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abc"}]},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError) as info:
        load_prompts(path, tokenizer, 100)
    message = str(info.value)
    assert f"{path}:2:" in message and "assistant" in message and "continue" in message


# ---------------------------------------------------------------------------- the first prompt, shown at start


def test_first_prompt_line_shows_newlines_escaped(tmp_path, tokenizer, capsys):
    messages = [{"role": "user", "content": "58+67="}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}, {"messages": messages}])
    prompts, stats = load_prompts(path, tokenizer, 100)
    show_first_prompt(prompts, stats, tokenizer)
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one line
    assert out == f"relayrl: first prompt (data.train, {path}:1, 24 tokens): 'user: 58+67=\\nassistant: '\n"


def test_first_prompt_is_the_first_kept_row(tmp_path, tokenizer, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "far too long a prompt"}, {"prompt": "1+1="}])
    prompts, stats = load_prompts(path, tokenizer, 8, "drop")
    show_first_prompt(prompts, stats, tokenizer, key="data.eval")
    assert f"(data.eval, {path}:2, 4 tokens): '1+1='" in capsys.readouterr().out


def test_first_prompt_shows_the_tokens_special_tokens(tmp_path, tokenizer, capsys):
    from tokenizers import processors

    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.bos_token_id)]
    )
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1="}])
    prompts, stats = load_prompts(path, tokenizer, 100)
    show_first_prompt(prompts, stats, tokenizer)
    assert "5 tokens): '<s>1+1='" in capsys.readouterr().out  # the BOS the tokenizer added is visible


def test_first_prompt_line_is_truncated_keeping_both_ends(tmp_path, tokenizer, capsys):
    text = "Q" + "x" * 1000 + "\nA:"
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": text}])
    prompts, stats = load_prompts(path, tokenizer, 2000)
    show_first_prompt(prompts, stats, tokenizer)
    out = capsys.readouterr().out
    shown = out.split(" tokens): ", 1)[1]
    assert out.count("\n") == 1 and len(shown) < 240
    assert "'Qxxx" in out and "xx\\nA:'" in out and "1004 chars" in out


# ---------------------------------------------------------------------------- null columns (parquet, exported jsonl)


def test_parquet_mixing_prompt_and_messages_rows_loads(tmp_path, tokenizer):
    # a table has every column in every row: a row's missing `prompt` is null, not absent
    rows = [{"prompt": "1+1=", "answer": "2"}, {"messages": [{"role": "user", "content": "2+2="}], "answer": "4"}]
    prompts, _ = load_prompts(write_parquet(tmp_path / "d.parquet", rows), tokenizer, 100)
    assert [p.text for p in prompts] == ["1+1=", "user: 2+2=\nassistant: "]
    assert [p.columns for p in prompts] == [{"answer": "2"}, {"answer": "4"}]


def test_a_chat_list_in_prompt_reads_as_messages_as_in_verl_parquet_and_trl(tmp_path, tokenizer):
    chat = [{"role": "user", "content": "2+2="}]
    verl = {"data_source": "toy", "prompt": chat, "reward_model": {"style": "rule", "ground_truth": "4"}}
    prompts, _ = load_prompts(write_parquet(tmp_path / "verl.parquet", [verl]), tokenizer, 100)
    (same,), _ = load_prompts(write_jsonl(tmp_path / "m.jsonl", [{"messages": chat}]), tokenizer, 100)
    assert [p.text for p in prompts] == [same.text] == ["user: 2+2=\nassistant: "]
    assert prompts[0].messages == chat and prompts[0].columns["reward_model"]["ground_truth"] == "4"


def test_null_prompt_and_messages_name_the_row_and_columns(tmp_path):
    path = write_parquet(
        tmp_path / "d.parquet", [{"prompt": "a", "messages": None}, {"prompt": None, "messages": None}]
    )
    with pytest.raises(DataError) as info:
        read_rows(path)
    assert f"{path}:row 1:" in str(info.value) and "'prompt'" in str(info.value) and "'messages'" in str(info.value)


def test_null_ids_fall_back_to_the_row_index(tmp_path, tokenizer):
    rows = [{"id": "q1", "prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]
    prompts, _ = load_prompts(write_parquet(tmp_path / "d.parquet", rows), tokenizer, 100)
    assert [p.id for p in prompts] == ["q1", "1", "2"]


def test_a_template_that_refuses_a_row_names_the_row(tmp_path, tokenizer):
    # as Llama-2/Mistral templates do: `raise_exception` when the roles do not alternate
    tokenizer.chat_template = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    rows = [
        {"messages": [{"role": "user", "content": "a"}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
    ]
    path = write_parquet(tmp_path / "d.parquet", rows)
    with pytest.raises(DataError) as info:
        load_prompts(path, tokenizer, 100)
    assert f"{path}:row 1:" in str(info.value) and "'messages'" in str(info.value)
    assert "roles must alternate" in str(info.value)


def test_a_prompt_with_no_tokens_names_the_column(tmp_path, tokenizer):
    tokenizer.chat_template = "{% for m in messages %}{% endfor %}"  # renders nothing
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok"}, {"messages": [{"role": "user", "content": "x"}]}])
    with pytest.raises(DataError) as info:
        load_prompts(path, tokenizer, 100)
    assert f"{path}:2:" in str(info.value) and "'messages'" in str(info.value) and "no tokens" in str(info.value)


def test_characters_the_tokenizer_lacks_are_named_once_and_counted(tmp_path):
    from relayrl.errors import DataWarning

    tok = train_char_tokenizer(["0123456789+="])  # a character vocabulary: '½' and '€' become its unk token
    rows = [{"prompt": "1+1="}, {"prompt": "½+1="}, {"prompt": "2€="}, {"prompt": "½="}]
    with pytest.warns(DataWarning) as record:
        prompts, stats = load_prompts(write_jsonl(tmp_path / "d.jsonl", rows), tok, 100)
    assert len(record) == 1 and stats.unknown == 3 and len(prompts) == 4
    message = str(record[0].message)
    assert f"{tmp_path / 'd.jsonl'}:2:" in message and "'½'" in message and repr(tok.unk_token) in message
