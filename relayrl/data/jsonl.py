"""JSON Lines, read one way everywhere: prompt files (relayrl/data), the run directory's metrics, timeline and
samples files (relayrl/run/jsonl.py) and `relayrl data check`.

A line ends at b"\\n" only and is decoded on its own, so a bad byte is reported at its line (a UTF-8 BOM is
allowed on the first line); it must hold one JSON object; blank lines are skipped. Every problem is a
DataError naming `file:line`. A file that a run appends to may end in a line cut short by a kill: with
`torn_tail_ok` that last line (not valid UTF-8 or not valid JSON) is left out with a note instead.
Left out: writing (each file's owner appends its own rows).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relayrl.errors import DataError

BLANK = object()  # what `_load` returns for a blank line (a line holding `null` loads as None)


def parse_line(raw: bytes, where: str, first: bool = False) -> dict[str, Any] | None:
    """The JSON object on one line (`raw`, with or without its newline); None for a blank line."""
    value = _load(raw, where, first)
    return None if value is BLANK else _as_object(value, where)


def _load(raw: bytes, where: str, first: bool) -> Any:
    try:
        line = raw.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{where}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
    if not line.strip():
        return BLANK
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None


def _as_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DataError(f"{where}: a row must be a JSON object, got {type(value).__name__}")
    return value


def iter_jsonl(
    path: str | Path, torn_tail_ok: bool = False, notes: list[str] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`file:line`, row) for every non-blank line, streamed. With `torn_tail_ok`, a line that does not parse
    is held back: it is an error if another non-blank line follows, else left out with a note in `notes`."""
    path = Path(path)
    held, held_at = None, ""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"{path}:{number}"
            if held is not None and raw.strip():
                raise held
            try:
                value = _load(raw, where, first=number == 1)
            except DataError as err:
                if not torn_tail_ok:
                    raise
                held, held_at = err, where
                continue
            if value is not BLANK:
                yield where, _as_object(value, where)
    if held is not None and notes is not None:
        notes.append(f"{held_at}: the last line is cut short (a run killed mid-write?); left out")
