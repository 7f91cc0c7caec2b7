"""Read an offline W&B run file (`run-<id>.wandb`) back in Python: its history rows, CRC-checked.

wandb >= 0.2x writes these files from its Go core and ships no Python reader (the old
`wandb.sdk.internal.datastore` is gone in 0.31). The framing is LevelDB's log format, as W&B's datastore
always used: a 7-byte file header (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each
`crc32(type + payload) | length | type` (FULL=1, FIRST=2, MIDDLE=3, LAST=4); a chunk header never straddles
a block (the tail of a block shorter than 7 bytes is padding). A whole record is one `wandb.proto` `Record`.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

BLOCK = 32 * 1024
FILE_HEADER = struct.Struct("<4sHB")  # ident, magic, version
CHUNK_HEADER = struct.Struct("<IHB")  # crc32, payload length, chunk type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list:
    """Every `Record` in the file, in order; a bad header or checksum raises."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = FILE_HEADER.unpack_from(data)
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path}: not a W&B run file (header {ident!r} {magic:#x} v{version})")
    records, pending, pos = [], b"", FILE_HEADER.size
    while pos + CHUNK_HEADER.size <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER.size:  # block trailer padding
            pos += BLOCK - pos % BLOCK
            continue
        crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        payload = data[pos + CHUNK_HEADER.size : pos + CHUNK_HEADER.size + length]
        if zlib.crc32(bytes([kind]) + payload) != crc:
            raise ValueError(f"{path}: checksum mismatch in the chunk at byte {pos}")
        pos += CHUNK_HEADER.size + length
        pending += payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def history_rows(path: Path) -> list[dict]:
    """The rows `run.log` wrote, as {key: value}, with W&B's own `_step` / `_runtime` / `_timestamp` keys."""
    rows = []
    for record in read_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows
