"""relayrl.data: prompt files -> validated, rendered, tokenized prompts; the resumable sampler; the toy task."""

from __future__ import annotations

import json
import string
from collections import Counter

import pytest

from relayrl.data.source import PromptSampler, load_prompts, read_rows
from relayrl.data.toy import needs_carry, sloppy_sum, write_toy_task
from relayrl.errors import DataError, RelayError
from relayrl.models.tiny import train_char_tokenizer
from relayrl.types import Prompt


@pytest.fixture(scope="module")
def tokenizer():
    """Character-level: one token per character, so token counts are string lengths."""
    return train_char_tokenizer([string.printable])


@pytest.fixture
def plain_tokenizer():
    tok = train_char_tokenizer([string.printable])
    tok.chat_template = None
    return tok


def write_jsonl(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def data_error(fn, *args, **kwargs) -> str:
    with pytest.raises(DataError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, RelayError)
    return str(info.value)


# ---------------------------------------------------------------------------- reading rows


def test_jsonl_prompt_rows_load_with_columns(tmp_path, tokenizer):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "1+1=", "answer": "2", "level": 1}, {"id": "q7", "prompt": "2+2=", "answer": "4", "level": 3}],
    )
    prompts, stats = load_prompts(path, tokenizer, max_prompt_tokens=100)
    assert [p.text for p in prompts] == ["1+1=", "2+2="]
    assert prompts[0].token_ids == tokenizer("1+1=", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(prompts[1].token_ids) == "2+2="
    assert prompts[0].columns == {"answer": "2", "level": 1}
    assert prompts[1].columns == {"id": "q7", "answer": "4", "level": 3}
    assert [p.id for p in prompts] == ["0", "q7"]  # the `id` column, else the row index
    assert (stats.dropped, stats.truncated) == (0, 0)


def test_parquet_loads_like_jsonl(tmp_path, tokenizer):
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "3+4=", "answer": "7"}]
    from_parquet, _ = load_prompts(write_parquet(tmp_path / "d.parquet", rows), tokenizer, 100)
    from_jsonl, _ = load_prompts(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, 100)
    assert from_parquet == from_jsonl
    assert [p.columns["answer"] for p in from_parquet] == ["2", "7"]


def test_messages_rows_use_the_chat_template(tmp_path, tokenizer):
    messages = [{"role": "system", "content": "Add. "}, {"role": "user", "content": "5+6="}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages, "answer": "11"}])
    (prompt,), _ = load_prompts(path, tokenizer, 100)
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.text == expected == "Add. 5+6="
    assert prompt.columns == {"answer": "11"}  # `messages` itself is not a column


def test_messages_rows_in_parquet(tmp_path, tokenizer):
    rows = [{"messages": [{"role": "user", "content": "9+1="}], "answer": "10"}]
    (prompt,), _ = load_prompts(write_parquet(tmp_path / "d.parquet", rows), tokenizer, 100)
    assert prompt.text == "9+1=" and prompt.columns == {"answer": "10"}


def test_messages_without_chat_template_fail(tmp_path, plain_tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    message = data_error(load_prompts, path, plain_tokenizer, 100)
    assert f"{path}:1" in message and "chat template" in message and "data.chat_template=false" in message


def test_messages_concatenated_when_chat_template_off(tmp_path, plain_tokenizer):
    messages = [{"role": "system", "content": "Add. "}, {"role": "user", "content": "5+6="}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}])
    (prompt,), _ = load_prompts(path, plain_tokenizer, 100, chat_template=False)
    assert prompt.text == "Add. 5+6="


def test_prompt_rows_ignore_chat_template(tmp_path, plain_tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "as is"}])
    (prompt,), _ = load_prompts(path, plain_tokenizer, 100)
    assert prompt.text == "as is"


def test_malformed_json_names_file_and_line_counting_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n{"prompt": "c",}\n{"prompt": "d"}\n')
    message = data_error(read_rows, path)
    assert f"{path}:5:" in message and "not valid JSON" in message


def test_blank_lines_are_skipped_and_do_not_shift_locations(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('\n{"prompt": "a"}\n\n{"prompt": "b"}\n\n')
    assert [where for where, _ in read_rows(path)] == [f"{path}:2", f"{path}:4"]


def test_crlf_and_bom_are_accepted(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\r\n{"prompt": "b"}\r\n')
    assert [row["prompt"] for _, row in read_rows(path)] == ["a", "b"]


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    message = data_error(read_rows, path)
    assert f"{path}:2:" in message and "UTF-8" in message


@pytest.mark.parametrize("line, kind", [("[1, 2]", "list"), ('"text"', "str"), ("3", "int"), ("null", "NoneType")])
def test_non_object_row(tmp_path, line, kind):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok"}, line])
    message = data_error(read_rows, path)
    assert f"{path}:2:" in message and "JSON object" in message and kind in message


@pytest.mark.parametrize(
    "row", [{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, {"question": "a", "answer": "b"}]
)
def test_row_needs_exactly_one_of_prompt_or_messages(tmp_path, row):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok"}, row])
    message = data_error(read_rows, path)
    assert f"{path}:2:" in message and "exactly one of 'prompt'" in message
    assert str(sorted(row)) in message  # shows the columns it did find


@pytest.mark.parametrize("value", ["", 3, None])
def test_prompt_must_be_a_nonempty_string(tmp_path, value):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": value}])
    message = data_error(read_rows, path)
    assert f"{path}:1:" in message and "'prompt' must be a non-empty string" in message and repr(value) in message


@pytest.mark.parametrize("value", [["a"], []])
def test_a_prompt_list_must_hold_chat_messages(tmp_path, value):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": value}])
    message = data_error(read_rows, path)
    assert f"{path}:1:" in message and (
        "prompt[0] must be an object" in message or "'prompt' must be a non-empty list" in message
    )


@pytest.mark.parametrize("messages", [[], "hi", {"role": "user", "content": "hi"}])
def test_messages_must_be_a_nonempty_list(tmp_path, messages):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}])
    message = data_error(read_rows, path)
    assert f"{path}:1:" in message and "'messages' must be a non-empty list" in message


@pytest.mark.parametrize(
    "bad",
    [{"role": "user"}, {"content": "hi"}, {"role": "user", "content": 5}, {"role": None, "content": "hi"}, "user: hi"],
)
def test_bad_message_entry_names_its_index(tmp_path, bad):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "system", "content": "s"}, bad]}])
    message = data_error(read_rows, path)
    assert f"{path}:1:" in message and "messages[1]" in message and "messages[0]" not in message


def test_unsupported_extension(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[{"prompt": "a"}]')
    message = data_error(read_rows, path)
    assert str(path) in message and "'.json'" in message and ".jsonl, .parquet or a datasets directory" in message


def test_missing_file(tmp_path):
    path = tmp_path / "missing.jsonl"
    message = data_error(read_rows, path)
    assert str(path) in message and "not found" in message


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_file(tmp_path, text):
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    message = data_error(read_rows, path)
    assert str(path) in message and "no rows" in message


def test_empty_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    assert "no rows" in data_error(read_rows, path)


def test_corrupt_parquet_names_the_file(tmp_path):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"this is not parquet")
    message = data_error(read_rows, path)
    assert str(path) in message and "cannot read parquet" in message


def test_parquet_row_errors_name_the_row(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", [{"prompt": "a"}, {"prompt": "b"}, {"prompt": ""}])
    message = data_error(read_rows, path)
    assert f"{path}:row 2:" in message  # rows are counted from 0
    assert "'prompt' must be a non-empty string" in message


def test_parquet_bad_message_names_row_and_index(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "a"}]}, {"messages": [{"role": "user", "content": None}]}]
    message = data_error(read_rows, write_parquet(tmp_path / "d.parquet", rows))
    assert "row 1:" in message and "messages[0]" in message


# ---------------------------------------------------------------------------- long prompts


@pytest.fixture
def long_file(tmp_path):
    return write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "short", "answer": "0"},
            {"prompt": "this one is long", "answer": "1"},
            {"prompt": "tiny", "answer": "2"},
        ],
    )


def test_long_prompt_error_names_line_count_and_limit(long_file, tokenizer):
    message = data_error(load_prompts, long_file, tokenizer, 8, "error")
    assert f"{long_file}:2:" in message
    assert "16 tokens" in message and "data.max_prompt_tokens=8" in message
    assert "data.on_long_prompt" in message


def test_prompt_exactly_at_the_limit_is_kept(long_file, tokenizer):
    prompts, _ = load_prompts(long_file, tokenizer, 16, "error")
    assert len(prompts) == 3


def test_long_prompt_drop(long_file, tokenizer):
    prompts, stats = load_prompts(long_file, tokenizer, 8, "drop")
    assert [p.text for p in prompts] == ["short", "tiny"]
    assert [p.columns["answer"] for p in prompts] == ["0", "2"]
    assert (stats.dropped, stats.truncated) == (1, 0)
    assert [p.id for p in prompts] == ["0", "2"]  # ids keep the file's row index


def test_long_prompt_truncate_keeps_the_last_tokens(long_file, tokenizer):
    prompts, stats = load_prompts(long_file, tokenizer, 8, "truncate")
    assert (stats.dropped, stats.truncated) == (0, 1)
    long = prompts[1]
    full = tokenizer("this one is long", add_special_tokens=False)["input_ids"]
    assert long.token_ids == full[-8:] and len(long.token_ids) == 8
    assert long.text == "this one is long"[-8:] == " is long"
    assert long.columns == {"answer": "1"}
    assert prompts[0].text == "short" and prompts[2].text == "tiny"


def test_limit_applies_after_the_chat_template(tmp_path):
    tokenizer = train_char_tokenizer([string.printable])
    tokenizer.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "abcd"}]}])
    assert "6 tokens" in data_error(load_prompts, path, tokenizer, 5)  # "[abcd]"
    (prompt,), _ = load_prompts(path, tokenizer, 6)
    assert prompt.text == "[abcd]"


def test_all_prompts_dropped_is_an_error(long_file, tokenizer):
    message = data_error(load_prompts, long_file, tokenizer, 2, "drop")
    assert str(long_file) in message and "every prompt was dropped" in message and "2 tokens" in message


def test_unknown_long_prompt_policy_is_rejected(long_file, tokenizer):
    with pytest.raises(ValueError, match="on_long_prompt"):
        load_prompts(long_file, tokenizer, 8, "trunc")


# ---------------------------------------------------------------------------- sampler


def make_prompts(n: int) -> list[Prompt]:
    return [Prompt(id=str(i), text=f"p{i}", token_ids=[i]) for i in range(n)]


def ids(batch: list[Prompt]) -> list[str]:
    return [p.id for p in batch]


def test_sampler_is_deterministic_for_a_seed():
    prompts = make_prompts(10)
    a, b = PromptSampler(prompts, seed=3), PromptSampler(prompts, seed=3)
    assert [ids(a.next(4)) for _ in range(6)] == [ids(b.next(4)) for _ in range(6)]


def test_sampler_differs_across_seeds():
    prompts = make_prompts(20)
    assert ids(PromptSampler(prompts, seed=0).next(20)) != ids(PromptSampler(prompts, seed=1).next(20))


def test_sampler_shuffles_and_reshuffles_each_epoch():
    prompts = make_prompts(20)
    sampler = PromptSampler(prompts, seed=0)
    first, second = ids(sampler.next(20)), ids(sampler.next(20))
    assert first != ids(prompts)  # shuffled
    assert first != second  # a new order each epoch


def test_sampler_covers_every_prompt_once_per_epoch():
    prompts = make_prompts(10)
    sampler = PromptSampler(prompts, seed=5)
    drawn = ids(sampler.next(3) + sampler.next(3) + sampler.next(3) + sampler.next(3))  # 12 = one epoch + 2
    assert sorted(drawn[:10]) == sorted(ids(prompts))
    assert Counter(drawn[10:]).most_common(1)[0][1] == 1
    assert sampler.epoch == 1 and sampler.position == 2


def test_sampler_batch_larger_than_the_dataset():
    sampler = PromptSampler(make_prompts(3), seed=0)
    batch = ids(sampler.next(7))
    assert len(batch) == 7
    assert sorted(batch[:3]) == sorted(batch[3:6]) == ["0", "1", "2"]
    assert batch[6] in {"0", "1", "2"}


@pytest.mark.parametrize("steps_before", [0, 1, 2, 3, 4, 7])  # 10 prompts, batches of 3: crosses epochs
def test_sampler_resume_matches_uninterrupted(steps_before):
    prompts = make_prompts(10)
    reference = PromptSampler(prompts, seed=11)
    expected = [ids(reference.next(3)) for _ in range(steps_before + 6)]

    first = PromptSampler(prompts, seed=11)
    for _ in range(steps_before):
        first.next(3)
    state = json.loads(json.dumps(first.state()))  # it is saved in a checkpoint as JSON
    resumed = PromptSampler(prompts, seed=11)
    resumed.load_state(state)
    assert [ids(resumed.next(3)) for _ in range(6)] == expected[steps_before:]


def test_sampler_resume_exactly_at_an_epoch_end():
    prompts = make_prompts(6)
    reference = PromptSampler(prompts, seed=2)
    expected = ids(reference.next(6) + reference.next(6) + reference.next(6))
    first = PromptSampler(prompts, seed=2)
    first.next(6)
    assert first.state() == {"epoch": 0, "position": 6, "prompts": len(prompts)}
    resumed = PromptSampler(prompts, seed=2)
    resumed.load_state(first.state())
    assert ids(resumed.next(12)) == expected[6:]


def test_a_checkpoint_over_another_prompt_file_is_refused_naming_both_counts():
    first = PromptSampler(make_prompts(10), seed=2)
    first.next(4)
    state = first.state()
    with pytest.raises(DataError, match="written over 10 prompts; data.train now has 8"):
        PromptSampler(make_prompts(8), seed=2).load_state(state)
    old = {"epoch": 0, "position": 2, "replay": [9]}  # written before states carried the count: its rows tell
    with pytest.raises(DataError, match="written over more prompts; data.train now has 8"):
        PromptSampler(make_prompts(8), seed=2).load_state(old)
    PromptSampler(make_prompts(10), seed=2).load_state(old)  # the same file: still loads


def test_sampler_without_shuffle_keeps_file_order():
    prompts = make_prompts(5)
    sampler = PromptSampler(prompts, seed=9, shuffle=False)
    assert ids(sampler.next(7)) == ["0", "1", "2", "3", "4", "0", "1"]


def test_sampler_needs_prompts():
    with pytest.raises(ValueError, match="at least one prompt"):
        PromptSampler([], seed=0)


# ---------------------------------------------------------------------------- toy task


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy")
    return write_toy_task(out, seed=0, max_operand=49, eval_size=200)


def test_toy_files_and_split(toy):
    train, held_out = read_jsonl(toy["train"]), read_jsonl(toy["eval"])
    assert len(held_out) == 200 and len(train) == (50 * 50 - 200) // 2
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    # the warm start and RL use disjoint problems
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in read_jsonl(toy["sft"])}
    for row in train + held_out:
        a, b = map(int, row["prompt"].rstrip("=").split("+"))
        assert row["answer"] == str(a + b)


def test_toy_is_fixed_by_the_seed(toy, tmp_path):
    again = write_toy_task(tmp_path / "again", seed=0, max_operand=49, eval_size=200)
    other = write_toy_task(tmp_path / "other", seed=1, max_operand=49, eval_size=200)
    for name in ("sft", "train", "eval"):
        assert again[name].read_bytes() == toy[name].read_bytes()
    assert other["eval"].read_text() != toy["eval"].read_text()


def test_toy_sft_never_contains_held_out_problems(toy):
    held_out = {r["prompt"] for r in read_jsonl(toy["eval"])}
    assert not held_out & {r["prompt"] for r in read_jsonl(toy["sft"])}


def test_sloppy_teacher_only_errs_on_carry_problems_by_ten(toy):
    wrong_carry = right_carry = 0
    for row in read_jsonl(toy["sft"]):
        a, b = map(int, row["prompt"].rstrip("=").split("+"))
        said = int(row["completion"])
        if not needs_carry(a, b):
            assert said == a + b, row
        elif said == a + b:
            right_carry += 1
        else:
            assert said == a + b - 10, row
            wrong_carry += 1
    rate = wrong_carry / (wrong_carry + right_carry)
    assert 0.5 < rate < 0.7  # SLOPPY_RATE = 0.6


def test_sloppy_sum():
    assert sloppy_sum(58, 67) == 115 and sloppy_sum(12, 34) == 46 and sloppy_sum(5, 5) == 0
    assert needs_carry(5, 5) and not needs_carry(14, 5)


def test_duplicate_ids_name_both_rows(tmp_path):
    tok = train_char_tokenizer(["ab+="])
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": "x", "prompt": "a"}\n{"id": "y", "prompt": "b"}\n{"id": "x", "prompt": "ab"}\n')
    with pytest.raises(DataError, match=rf"{path}:3: id 'x' is already used at {path}:1"):
        load_prompts(path, tok, 16)
