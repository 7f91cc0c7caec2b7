"""The run directory's JSONL files (metrics, timeline, samples): reading them back, and cutting them at a step.

Rows are appended one `write` per row while a run goes on, so a run killed mid-write leaves at most its last
line cut short: readers leave that one line out (with a note), and any other malformed line is an error
naming `file:line`. The lines are read by relayrl/data/jsonl.py, the one JSONL reader (prompt files use it too).
Left out: writing (each file's owner appends its own rows).
"""

from __future__ import annotations

import json
from pathlib import Path

from relayrl.data.jsonl import iter_jsonl
from relayrl.errors import DataError


def read_jsonl(path: Path, required: dict[str, type | tuple], notes: list[str] | None = None) -> list[dict]:
    """Rows of a JSONL file, each an object whose `required` keys have the given types. A malformed line raises
    DataError naming `file:line`, except the last line when it is not valid JSON: a write cut short by a kill,
    left out, with a note appended to `notes` (relayrl/data/jsonl.py reads the lines). Blank lines are skipped; an
    empty file gives no rows."""
    rows = []
    for where, row in iter_jsonl(path, torn_tail_ok=True, notes=notes):
        for key, kind in required.items():
            if not isinstance(row.get(key), kind) or isinstance(row.get(key), bool):
                raise DataError(f"{where}: key {key!r} missing or not {getattr(kind, '__name__', 'a number')}")
        rows.append(row)
    return rows


def truncate_after(path: str | Path, step: int) -> None:
    """Keep only the rows of `path` whose `step` is at most `step` (a resumed run re-logs the steps after its
    checkpoint). Lines that are not JSON objects with a `step` (a row cut short by a kill) are dropped.
    Rewritten atomically (temp file + rename); a missing file stays missing."""
    path = Path(path)
    if not path.is_file():
        return
    kept = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append(line + "\n")
    temp = path.with_name(path.name + ".tmp")
    temp.write_text("".join(kept))
    temp.replace(path)
