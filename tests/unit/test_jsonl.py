"""relayrl/data/jsonl.py: the one JSONL reader, shared by prompt files and the run directory's files."""

from __future__ import annotations

import pytest

from relayrl.data.jsonl import iter_jsonl
from relayrl.data.source import read_rows
from relayrl.errors import DataError
from relayrl.run.jsonl import read_jsonl


def _message(fn, *args) -> str:
    with pytest.raises(DataError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize(
    "bad, problem",
    [(b'{"prompt": "a", "step": 1,}', "not valid JSON"), (b"\xff\xfe", "not valid UTF-8"), (b"null", "JSON object")],
)
def test_prompt_files_and_run_files_report_a_bad_middle_line_alike(tmp_path, bad, problem):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"prompt": "a", "step": 0}\n\n' + bad + b'\n{"prompt": "b", "step": 2}\n')
    from_data, from_run = _message(read_rows, path), _message(read_jsonl, path, {"step": int})
    assert from_data == from_run and from_data.startswith(f"{path}:3:") and problem in from_data


def test_a_torn_last_line_is_an_error_in_a_prompt_file_and_a_note_in_a_run_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"prompt": "a", "step": 0}\n\n{"prompt": "b", "st\n\n')
    assert f"{path}:3:" in _message(read_rows, path)
    notes: list[str] = []
    assert [row["step"] for row in read_jsonl(path, {"step": int}, notes)] == [0]
    assert notes and notes[0].startswith(f"{path}:3:") and "left out" in notes[0]


def test_lines_end_at_newline_only_and_a_bom_is_allowed_first(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes('\ufeff{"prompt": "a\u2028b"}\r\n{"prompt": "c"}'.encode())
    assert [(where, row["prompt"]) for where, row in iter_jsonl(path)] == [
        (f"{path}:1", "a\u2028b"),
        (f"{path}:2", "c"),
    ]
