"""Random access to the rows of a prompt file without reading it whole: jsonl, parquet, or a `datasets` directory.

- `.jsonl`: the file is indexed once (where each non-blank line starts and ends: 16 bytes a row) and mapped;
  a row is decoded by the one JSONL reader (relayrl/data/jsonl.py) when it is first asked for. Arrow's JSON
  reader is not used: it loses line numbers and refuses a file whose rows differ in their columns' types.
- `.parquet`: up to CACHE_PARQUET_ROWS rows, read by pyarrow into Arrow columns; more, converted once by
  Hugging Face `datasets` (`Dataset.from_parquet`) into its Arrow cache and memory-mapped from there.
- a directory written by Hugging Face `Dataset.save_to_disk`: memory-mapped as it is (`load_from_disk`).

`read(i)` returns (`location`, row), the row checked as relayrl/data/source.py requires; the location is
`file:line` (jsonl, counted from 1) or `file:row N` (Arrow, counted from 0). Left out: rendering and
tokenising (relayrl/data/source.py), and streaming from the Hub.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from relayrl.data.jsonl import parse_line
from relayrl.data.reasoning_gym import ReasoningGymRows, is_spec
from relayrl.errors import DataError

CHUNK = 1 << 22  # bytes scanned for newlines at a time while indexing
SHORT = 16  # a line this short may be blank (whitespace only); longer ones hold a row or a mistake
CACHE_PARQUET_ROWS = 10_000  # a parquet file of more rows is read through the `datasets` cache


class JsonlRows:
    """The rows of a .jsonl file: an index of its lines over a memory map of it."""

    def __init__(self, path: Path):
        self.path = path
        with path.open("rb") as f:
            size = path.stat().st_size
            self.data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self.starts, self.lengths, self.lines = _index_lines(path, size)

    def __len__(self) -> int:
        return len(self.starts)

    def read(self, i: int) -> tuple[str, dict[str, Any]]:
        where, line = f"{self.path}:{int(self.lines[i])}", int(self.lines[i])
        start = int(self.starts[i])
        row = parse_line(self.data[start : start + int(self.lengths[i])], where, first=line == 1)
        if row is None:
            raise DataError(f"{where}: a line of only whitespace; remove it")
        return where, row


def _index_lines(path: Path, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, length, line number) of every non-blank line, as int64 / uint32 / uint32 arrays. The file is read
    in chunks into one buffer, so its pages are not all held at once. A line that is short or starts with
    whitespace may be blank: those few are read back and checked (a row starts with `{`)."""
    buffer, newlines, firsts = bytearray(CHUNK), [], []
    with path.open("rb") as f:
        for offset in range(0, size, CHUNK):
            got = f.readinto(buffer)
            chunk = np.frombuffer(buffer, np.uint8, got)
            found = np.flatnonzero(chunk == 10)
            newlines.append(found + offset)
            firsts.append(np.append(chunk[:1], chunk[np.minimum(found + 1, got - 1)]))  # byte after each newline
    ends = np.concatenate(newlines + [np.array([size], np.int64)])
    del newlines
    starts = np.concatenate([np.zeros(1, np.int64), ends[:-1] + 1])
    if len(ends) > 1 and ends[-2] + 1 == size:  # the file ends with a newline: no line after it
        starts, ends = starts[:-1], ends[:-1]
    lengths = (ends - starts).astype(np.uint32)
    del ends
    maybe_blank = (lengths <= SHORT) | np.isin(_first_bytes(firsts, starts, path), WHITESPACE)
    keep = ~maybe_blank
    with path.open("rb") as f:
        for i in np.flatnonzero(maybe_blank):
            f.seek(int(starts[i]))
            keep[i] = bool(f.read(int(lengths[i])).strip())
    lines = np.flatnonzero(keep).astype(np.uint32) + 1
    return starts[keep], lengths[keep], lines


WHITESPACE = np.frombuffer(b" \t\r\x0b\x0c", np.uint8)


def _first_bytes(firsts: list[np.ndarray], starts: np.ndarray, path: Path) -> np.ndarray:
    """The first byte of every line. Each chunk gave its first byte and the byte after each of its newlines
    (the newline's own byte when it ends the chunk: those lines, one per chunk at most, are read here)."""
    if not firsts:
        return np.zeros(len(starts), np.uint8)
    candidates = np.concatenate([chunk[1:] for chunk in firsts])[: len(starts) - 1]
    result = np.concatenate([firsts[0][:1], candidates])
    with path.open("rb") as f:
        for i in np.flatnonzero(result == 10):  # a line starting at a chunk's boundary, or an empty one
            f.seek(int(starts[i]))
            result[i] = (f.read(1) or b"\n")[0]
    return result


class ArrowRows:
    """The rows of a parquet file or of a `save_to_disk` directory (memory-mapped as it lies on disk), as an
    Arrow table: no Python object per row until a row is read."""

    def __init__(self, path: Path):
        self.path = path
        what = "a datasets directory (save_to_disk)" if path.is_dir() else "parquet"
        try:
            self.table = _load_from_disk(path) if path.is_dir() else _read_parquet(path)
        except DataError:
            raise
        except Exception as err:  # noqa: BLE001 - datasets and pyarrow raise several types for a bad file
            raise DataError(f"{path}: cannot read {what}: {err}") from None

    def __len__(self) -> int:
        return self.table.num_rows

    def read(self, i: int) -> tuple[str, dict[str, Any]]:
        return f"{self.path}:row {i}", self.table.slice(int(i), 1).to_pylist()[0]


def _read_parquet(path: Path):
    """A small file's decoded columns; a large one's Arrow table as `datasets` caches it (converted on the first
    read, into HF_DATASETS_CACHE), memory-mapped: decoded columns would outgrow the compressed file many times."""
    import pyarrow.parquet as pq

    if pq.ParquetFile(path).metadata.num_rows <= CACHE_PARQUET_ROWS:
        return pq.read_table(path, memory_map=True)
    import datasets

    return datasets.Dataset.from_parquet(str(path)).data.table


def _load_from_disk(path: Path):
    """The memory-mapped Arrow table of a `Dataset.save_to_disk` directory."""
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        raise DataError(f"{path}: a DatasetDict (splits {', '.join(map(str, loaded))}); point at one split's directory")
    return loaded.data.table


def open_rows(
    path: str | Path, check: Callable[[str, dict[str, Any]], None], prompt_key: str = "prompt"
) -> CheckedRows:
    """The rows of a prompt file or `datasets` directory (or a `reasoning_gym:TASK` spec, relayrl/data/reasoning_gym.py,
    or a `verifiers:TASKSET` one, relayrl/data/verifiers_tasks.py);
    each is checked by `check` when it is read, its prompt read from the `prompt_key` column (`data.prompt_key`)."""
    if is_spec(path):
        return CheckedRows(ReasoningGymRows(str(path)), check, prompt_key)  # a key it lacks: named, not ignored
    if isinstance(path, str) and path.startswith("verifiers:"):  # a verifiers taskset's tasks
        from relayrl.data.verifiers_tasks import VerifiersRows

        rows = VerifiersRows(path)
        if not len(rows):
            raise DataError(f"{path}: the taskset has no tasks")
        return CheckedRows(rows, check, prompt_key)
    path = Path(path)
    if path.is_dir():
        rows = ArrowRows(path)
    elif not path.is_file():
        raise DataError(f"data file not found: {path}")
    elif path.suffix == ".jsonl":
        rows = JsonlRows(path)
    elif path.suffix == ".parquet":
        rows = ArrowRows(path)
    else:
        raise DataError(
            f"{path}: unsupported data format {path.suffix!r} (use .jsonl, .parquet or a datasets directory)"
        )
    if not len(rows):
        raise DataError(f"{path}: no rows")
    return CheckedRows(rows, check, prompt_key)


class CheckedRows:
    def __init__(self, rows, check: Callable[[str, dict[str, Any]], None], prompt_key: str = "prompt"):
        self.rows, self.check, self.path, self.prompt_key = rows, check, rows.path, prompt_key

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, i: int) -> tuple[str, dict[str, Any]]:
        where, row = self.rows.read(i)
        if self.prompt_key != "prompt":
            row = keyed_prompt(where, row, self.prompt_key)
        self.check(where, row)
        return where, row


def keyed_prompt(where: str, row: dict[str, Any], key: str) -> dict[str, Any]:
    """The row with its `key` column as its prompt: `prompt` for text, `messages` for a chat list (checked next,
    as any row is). The column itself stays, for the reward functions that read it by name."""
    if row.get(key) is None:
        columns = ", ".join(repr(k) for k in sorted(row)) or "none"
        raise DataError(f"{where}: no {key!r} column (data.prompt_key={key}); the row's columns: {columns}")
    if taken := [k for k in ("prompt", "messages") if row.get(k) is not None]:
        raise DataError(
            f"{where}: data.prompt_key={key} names the prompt, but the row also has {taken[0]!r}: drop or rename "
            f"that column, or set data.prompt_key={taken[0]}"
        )
    return {**row, "messages" if isinstance(row[key], list) else "prompt": row[key]}
