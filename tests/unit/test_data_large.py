"""Large prompt files: rows read when drawn (relayrl/data/rows.py, PromptTable), `relayrl data check`."""

from __future__ import annotations

import json
import string

import pytest

from relayrl.cli import main
from relayrl.data import source
from relayrl.data.jsonl import iter_jsonl
from relayrl.data.source import PromptSampler, PromptTable, load_prompts, read_rows
from relayrl.errors import DataError
from relayrl.models.tiny import train_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_char_tokenizer([string.printable])


@pytest.fixture
def lazy(monkeypatch):
    monkeypatch.setattr(source, "EAGER_ROWS", 2)  # files over 2 rows are read lazily


def _rows(n: int) -> list[dict]:
    return [{"prompt": f"question {i}" + "?" * (i % 7), "answer": str(i)} for i in range(n)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_line_index_finds_the_rows_and_lines_the_streaming_reader_finds(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes('\ufeff{"prompt": "a"}\r\n\n   \n{"prompt": "b"}\n\n{"prompt": "c"}'.encode())
    assert read_rows(path) == list(iter_jsonl(path))
    assert [where for where, _ in read_rows(path)] == [f"{path}:1", f"{path}:4", f"{path}:6"]


@pytest.mark.parametrize("chunk", [7, 16, 1 << 22])  # chunk boundaries inside, at and after lines
def test_long_whitespace_lines_and_indented_rows_are_indexed_as_the_streaming_reader_reads_them(
    tmp_path, monkeypatch, chunk
):
    from relayrl.data import rows

    monkeypatch.setattr(rows, "CHUNK", chunk)
    path = tmp_path / "d.jsonl"
    text = " " * 40 + '\n  {"prompt": "indented"}\n\t\t\r\n{"prompt": "a"}\n' + "\t" * 30 + '\n{"prompt": "b"}\n'
    path.write_text(text)
    assert read_rows(path) == list(iter_jsonl(path))
    assert [where.rsplit(":", 1)[1] for where, _ in read_rows(path)] == ["2", "4", "6"]


def test_a_lazy_table_gives_the_prompts_the_eager_list_gives(tmp_path, tokenizer, monkeypatch, capsys):
    path = _jsonl(tmp_path / "d.jsonl", _rows(9))
    eager, _ = load_prompts(path, tokenizer, 12, "drop")
    monkeypatch.setattr(source, "EAGER_ROWS", 2)
    table, stats = load_prompts(path, tokenizer, 12, "drop")
    assert isinstance(table, PromptTable) and len(table) == 9 and stats.dropped == 0  # nothing read yet
    assert [p for p in map(table.get, range(9)) if p is not None] == eager
    assert table[0] == eager[0] and table[-1] == eager[-1]  # the first and last kept, as in the list
    assert list(table) == eager == table[:]
    assert stats.dropped == 9 - len(eager) and table.longest == 12
    source.show_first_prompt(table, stats, tokenizer)
    assert "9 rows, over 2: each is read" in capsys.readouterr().out
    table.get(6)
    assert stats.dropped == 9 - len(eager)  # counted once per row


def test_the_sampler_over_a_table_passes_over_dropped_rows_and_resumes_exactly(tmp_path, tokenizer, lazy):
    table, _ = load_prompts(_jsonl(tmp_path / "d.jsonl", _rows(20)), tokenizer, 12, "drop")
    sampler = PromptSampler(table, seed=3)
    first = [p.id for p in sampler.next(7)]
    state = sampler.state()
    rest = [p.id for p in sampler.next(30)]
    resumed = PromptSampler(table, seed=3)
    resumed.load_state(state)
    assert [p.id for p in resumed.next(30)] == rest
    kept = {p.id for p in table}
    assert set(first + rest) == kept and len(kept) < 20  # every kept row, no dropped one


def test_a_bad_row_of_a_lazy_file_fails_when_drawn_naming_its_line(tmp_path, tokenizer, lazy):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in _rows(4)) + '{"prompt": 3}\n')
    table, _ = load_prompts(path, tokenizer, 100)  # starts: the bad row is not read yet
    with pytest.raises(DataError, match=rf"{path}:5: 'prompt' must be a non-empty string"):
        PromptSampler(table, seed=0, shuffle=False).next(5)


def test_a_datasets_directory_loads_like_its_jsonl(tmp_path, tokenizer, lazy):
    import datasets

    rows = _rows(6)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    from_dir, _ = load_prompts(tmp_path / "ds", tokenizer, 100)
    from_jsonl, _ = load_prompts(_jsonl(tmp_path / "d.jsonl", rows), tokenizer, 100)
    assert from_dir[:] == from_jsonl[:]
    assert read_rows(tmp_path / "ds")[2][0] == f"{tmp_path / 'ds'}:row 2"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match="DatasetDict.*train"):
        read_rows(tmp_path / "dd")


def test_data_check_reads_every_row_up_front(tmp_path, capsys, random_model_dir):
    good = _jsonl(tmp_path / "good.jsonl", _rows(5))
    assert main(["data", "check", str(good), "--model", str(random_model_dir), "--max-prompt-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "5 rows, all readable" in out and "over --max-prompt-tokens=12" in out
    dup = _jsonl(tmp_path / "dup.jsonl", [{"id": "a", "prompt": "x"}, {"prompt": "y"}, {"id": "a", "prompt": "z"}])
    assert main(["data", "check", str(dup)]) == 2
    assert f"{dup}:3: id 'a' is already used at {dup}:1" in capsys.readouterr().err


def test_the_trainer_loads_a_large_file_lazily_with_the_limit_as_its_longest_prompt(tmp_path, tokenizer, lazy, capsys):
    from relayrl.build import load_data
    from relayrl.config import load_config
    from relayrl.data.source import longest_prompt_tokens

    train = _jsonl(tmp_path / "train.jsonl", _rows(9))
    held_out = _jsonl(tmp_path / "eval.jsonl", _rows(5))
    config = load_config(
        None, [f"data.train={train}", f"data.eval={held_out}", "data.max_prompt_tokens=12", "data.on_long_prompt=drop"]
    )
    prompts, eval_prompts, metrics = load_data(config.data, config.eval.max_prompts, tokenizer)
    assert isinstance(prompts, PromptTable) and isinstance(eval_prompts, list)  # evaluated whole: a list
    assert longest_prompt_tokens(prompts, eval_prompts) == 12  # the engine is sized for the limit
    assert "first prompt (data.train, " in capsys.readouterr().out
    assert metrics["data/prompts_dropped"] == 0  # rows 0 and 1 read so far, both kept


def test_a_large_parquet_file_is_read_through_the_datasets_cache(tmp_path, monkeypatch):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from relayrl.data import rows

    monkeypatch.setattr(rows, "CACHE_PARQUET_ROWS", 2)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(5)[:4] + [{"prompt": None, "answer": "4"}]), path)
    with pytest.raises(DataError, match=rf"{path}:row 4: 'prompt' must be a non-empty string"):
        read_rows(path)
    assert list((tmp_path / "cache").rglob("*.arrow"))  # converted once, memory-mapped from there
