"""Prompt files (jsonl, parquet) -> validated rows -> rendered, tokenized `Prompt`s; and the resumable sampler.

A row has a `prompt` (string) or `messages` (list of {role, content}) column; every other column travels
with the prompt to the reward function. A malformed row fails with `file:line` (jsonl) or `file:row N`
(parquet) and what is wrong with it. Over-long prompts follow `data.on_long_prompt`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from relayrl.errors import DataError
from relayrl.types import Prompt


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(location, row) pairs from a .jsonl or .parquet file; location is `file:line` or `file:row N`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    if path.suffix == ".jsonl":
        rows = list(_read_jsonl(path))
    elif path.suffix == ".parquet":
        rows = _read_parquet(path)
    else:
        raise DataError(f"{path}: unsupported data format {path.suffix!r} (use .jsonl or .parquet)")
    if not rows:
        raise DataError(f"{path}: no rows")
    for where, row in rows:
        _check_row(where, row)
    return rows


def _read_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"{path}:{number}"
            try:  # decode per line so that a bad byte is reported at its line; tolerate a leading BOM
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{where}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
            yield where, row


def _read_parquet(path: Path) -> list[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a bad file
        raise DataError(f"{path}: cannot read parquet: {err}") from None
    return [(f"{path}:row {i}", row) for i, row in enumerate(table.to_pylist())]


def _check_row(where: str, row: dict[str, Any]) -> None:
    has_prompt, has_messages = "prompt" in row, "messages" in row
    if has_prompt == has_messages:
        raise DataError(f"{where}: a row needs exactly one of 'prompt' (string) or 'messages' (chat list); "
                        f"found columns {sorted(row)}")
    if has_prompt and not (isinstance(row["prompt"], str) and row["prompt"]):
        raise DataError(f"{where}: 'prompt' must be a non-empty string, got {row['prompt']!r}")
    if has_messages:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
        for i, message in enumerate(messages):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise DataError(f"{where}: messages[{i}] must be an object with string 'role' and 'content', "
                                f"got {message!r}")


@dataclass
class LongPromptStats:
    dropped: int = 0
    truncated: int = 0


def load_prompts(path: str | Path, tokenizer, max_prompt_tokens: int, on_long_prompt: str = "error",
                 chat_template: bool = True) -> tuple[list[Prompt], LongPromptStats]:
    """Render and tokenize every row. Returns the prompts and how many were dropped or truncated."""
    if on_long_prompt not in ("error", "drop", "truncate"):
        raise ValueError(f"on_long_prompt must be error, drop or truncate, got {on_long_prompt!r}")
    stats = LongPromptStats()
    prompts = []
    seen_ids: dict[str, str] = {}
    for index, (where, row) in enumerate(read_rows(path)):
        text = render(row, tokenizer, chat_template, where)
        # a chat template writes its own special tokens; a plain prompt gets the tokenizer's (e.g. BOS)
        token_ids = tokenizer(text, add_special_tokens="prompt" in row)["input_ids"]
        if not token_ids:
            raise DataError(f"{where}: the prompt tokenizes to no tokens")
        prompt_id = str(row.get("id", index))
        if prompt_id in seen_ids:
            raise DataError(f"{where}: id {prompt_id!r} is already used at {seen_ids[prompt_id]}; ids must be unique")
        seen_ids[prompt_id] = where
        if len(token_ids) > max_prompt_tokens:
            if on_long_prompt == "error":
                raise DataError(f"{where}: prompt has {len(token_ids)} tokens, over data.max_prompt_tokens="
                                f"{max_prompt_tokens} (set data.on_long_prompt=drop or truncate to continue)")
            if on_long_prompt == "drop":
                stats.dropped += 1
                continue
            stats.truncated += 1
            token_ids = token_ids[-max_prompt_tokens:]  # keep the end, where the question usually is
            text = tokenizer.decode(token_ids)
        columns = {k: v for k, v in row.items() if k not in ("prompt", "messages")}
        prompts.append(Prompt(id=prompt_id, text=text, token_ids=token_ids, columns=columns))
    if not prompts:
        raise DataError(f"{path}: every prompt was dropped as longer than {max_prompt_tokens} tokens")
    return prompts, stats


def render(row: dict[str, Any], tokenizer, chat_template: bool, where: str = "") -> str:
    if "prompt" in row:
        return row["prompt"]
    if not chat_template:
        return "".join(m["content"] for m in row["messages"])
    if tokenizer.chat_template is None:
        raise DataError(f"{where}: a 'messages' row needs a tokenizer with a chat template "
                        "(or set data.chat_template=false to concatenate the contents)")
    return tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)


class PromptSampler:
    """Deterministic epochs over the prompts: shuffled by (seed, epoch), resumable from `state()`."""

    def __init__(self, prompts: list[Prompt], seed: int, shuffle: bool = True):
        if not prompts:
            raise ValueError("PromptSampler needs at least one prompt")  # next() would never return
        self.prompts = prompts
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.prompts))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))

    def next(self, count: int) -> list[Prompt]:
        batch = []
        while len(batch) < count:
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order(self.epoch)
            batch.append(self.prompts[self._order[self.position]])
            self.position += 1
        return batch

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._epoch_order(self.epoch)
