"""Prompt files (jsonl, parquet) -> validated rows -> rendered, tokenized `Prompt`s; and the resumable sampler.

A row has a `prompt` (string) or `messages` (list of {role, content}) column; every other column travels
with the prompt to the reward function. A null `prompt`/`messages`/`id` counts as absent, so a parquet table
may mix both kinds of row. `messages` ending with an assistant turn is a prefix the model continues (as TRL
renders a conversational prompt). A malformed row fails with `file:line` (jsonl) or `file:row N` (parquet,
counted from 0) and what is wrong with it. Over-long prompts follow `data.on_long_prompt`. Rows are read
into memory whole; streaming very large files is left to the sampler's own issue.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from relayrl.errors import DataError
from relayrl.jsonl import iter_jsonl
from relayrl.types import Prompt


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(location, row) pairs from a .jsonl or .parquet file; location is `file:line` or `file:row N`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    if path.suffix == ".jsonl":
        rows = list(iter_jsonl(path))  # the one JSONL reader (relayrl/jsonl.py)
    elif path.suffix == ".parquet":
        rows = _read_parquet(path)
    else:
        raise DataError(f"{path}: unsupported data format {path.suffix!r} (use .jsonl or .parquet)")
    if not rows:
        raise DataError(f"{path}: no rows")
    for where, row in rows:
        _check_row(where, row)
    return rows


def _read_parquet(path: Path) -> list[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a bad file
        raise DataError(f"{path}: cannot read parquet: {err}") from None
    return [(f"{path}:row {i}", row) for i, row in enumerate(table.to_pylist())]


def _row_kind(where: str, row: dict[str, Any]) -> str:
    """'prompt' or 'messages': the one this row sets. A table fills the other with null, which counts as unset."""
    kinds = ("prompt", "messages")
    set_kinds = [kind for kind in kinds if row.get(kind) is not None]
    if len(set_kinds) == 1:
        return set_kinds[0]
    named = [kind for kind in kinds if kind in row]
    if not set_kinds and len(named) == 1:
        return named[0]  # a lone null column: its own check below says what it must hold
    nulls = [column for column in kinds if column in row and row[column] is None]
    raise DataError(
        f"{where}: a row needs exactly one of 'prompt' (string) or 'messages' (chat list); "
        f"found columns {sorted(row)}" + (f" (null: {', '.join(map(repr, nulls))})" if nulls else "")
    )


def is_plain_prompt(row: dict[str, Any]) -> bool:
    return row.get("prompt") is not None


def _check_row(where: str, row: dict[str, Any]) -> None:
    kind = _row_kind(where, row)
    if kind == "prompt" and not (isinstance(row["prompt"], str) and row["prompt"]):
        raise DataError(f"{where}: 'prompt' must be a non-empty string, got {row['prompt']!r}")
    if kind == "messages":
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
        for i, message in enumerate(messages):
            if not (
                isinstance(message, dict)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
            ):
                raise DataError(
                    f"{where}: messages[{i}] must be an object with string 'role' and 'content', got {message!r}"
                )


@dataclass
class LoadStats:
    """What loading a prompt file did: long prompts dropped or truncated, and where the first kept prompt is."""

    dropped: int = 0
    truncated: int = 0
    first_location: str = ""


def load_prompts(
    path: str | Path, tokenizer, max_prompt_tokens: int, on_long_prompt: str = "error", chat_template: bool = True
) -> tuple[list[Prompt], LoadStats]:
    """Render and tokenize every row. Returns the prompts and how many were dropped or truncated."""
    if on_long_prompt not in ("error", "drop", "truncate"):
        raise ValueError(f"on_long_prompt must be error, drop or truncate, got {on_long_prompt!r}")
    stats = LoadStats()
    prompts = []
    seen_ids: dict[str, str] = {}
    for index, (where, row) in enumerate(read_rows(path)):
        text = render(row, tokenizer, chat_template, where)
        # a chat template writes its own special tokens; a plain prompt gets the tokenizer's (e.g. BOS)
        token_ids = tokenizer(text, add_special_tokens=is_plain_prompt(row))["input_ids"]
        if not token_ids:
            column = "'prompt'" if is_plain_prompt(row) else "'messages' (after the chat template)"
            raise DataError(f"{where}: {column} tokenizes to no tokens")
        prompt_id = str(index if row.get("id") is None else row["id"])  # a table's missing id is null
        if prompt_id in seen_ids:
            raise DataError(f"{where}: id {prompt_id!r} is already used at {seen_ids[prompt_id]}; ids must be unique")
        seen_ids[prompt_id] = where
        if len(token_ids) > max_prompt_tokens:
            if on_long_prompt == "error":
                raise DataError(
                    f"{where}: prompt has {len(token_ids)} tokens, over data.max_prompt_tokens="
                    f"{max_prompt_tokens} (set data.on_long_prompt=drop or truncate to continue)"
                )
            if on_long_prompt == "drop":
                stats.dropped += 1
                continue
            stats.truncated += 1
            token_ids = token_ids[-max_prompt_tokens:]  # keep the end, where the question usually is
            text = tokenizer.decode(token_ids)
        columns = {k: v for k, v in row.items() if k not in ("prompt", "messages")}
        prompts.append(
            Prompt(
                id=prompt_id,
                text=text,
                token_ids=token_ids,
                columns=columns,
                messages=None if is_plain_prompt(row) else row["messages"],
            )
        )
        stats.first_location = stats.first_location or where
    if not prompts:
        raise DataError(f"{path}: every prompt was dropped as longer than {max_prompt_tokens} tokens")
    return prompts, stats


def render(row: dict[str, Any], tokenizer, chat_template: bool, where: str = "") -> str:
    """The prompt text: `prompt` as-is, or `messages` through the chat template.

    Messages ending with a user (or tool, system) turn get the template's generation prompt; ending with an
    assistant turn, that turn is left open for the model to continue (`continue_final_message`), as TRL
    renders a conversational prompt, instead of closing it and opening a second assistant turn.
    """
    if is_plain_prompt(row):
        return row["prompt"]
    messages = row["messages"]
    if not chat_template:
        return "".join(m["content"] for m in messages)
    if tokenizer.chat_template is None:
        raise DataError(
            f"{where}: a 'messages' row needs a tokenizer with a chat template "
            "(or set data.chat_template=false to concatenate the contents)"
        )
    from jinja2 import TemplateError

    continues = messages[-1]["role"] == "assistant"
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=not continues, continue_final_message=continues
        )
    except TemplateError as err:  # the template's own `raise_exception`, e.g. roles that do not alternate
        raise DataError(f"{where}: the chat template refuses 'messages': {err}") from None
    except ValueError as err:
        if not continues:
            raise DataError(f"{where}: the chat template cannot render 'messages': {err}") from None
        raise DataError(
            f"{where}: 'messages' ends with an assistant turn, which is continued as the start of "
            "the answer, but the chat template does not write that turn's content verbatim, so it cannot be left open; end "
            "the row with a user turn, or give the exact text as a 'prompt' row"
        ) from None


def show_first_prompt(
    prompts: list[Prompt], stats: LoadStats, tokenizer, key: str = "data.train", width: int = 200
) -> None:
    """Print, on one line, the first prompt exactly as the model sees it: its tokens decoded, special ones
    included, with repr escapes so newlines and spaces show; a long one keeps its start and its end."""
    shown = tokenizer.decode(prompts[0].token_ids, skip_special_tokens=False)
    if len(repr(shown)) <= width:
        text = repr(shown)
    else:  # the end holds the generation prompt, the part most often wrong
        text = f"{shown[: width // 2]!r} ... {shown[-width // 2 :]!r} ({len(shown)} chars)"
    print(f"relayrl: first prompt ({key}, {stats.first_location}, {len(prompts[0].token_ids)} tokens): {text}")


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
