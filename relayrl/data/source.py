"""Prompt files (jsonl, parquet, `datasets` directories) -> checked rows -> rendered, tokenized `Prompt`s; and
the resumable sampler.

A row has a `prompt` (string) or `messages` (list of {role, content}) column; every other column travels
with the prompt to the reward function. A null `prompt`/`messages`/`id` counts as absent, so a parquet table
may mix both kinds of row. `messages` ending with an assistant turn is a prefix the model continues (as TRL
renders a conversational prompt). A malformed row fails with `file:line` (jsonl) or `file:row N` (Arrow,
counted from 0) and what is wrong with it. Over-long prompts follow `data.on_long_prompt`. A file of up to
EAGER_ROWS rows is read whole at start; a larger one is a `PromptTable` over memory-mapped rows
(relayrl/data/rows.py), each row checked and tokenised when the sampler draws it (so a bad row fails then,
or up front with `relayrl data check`), and the dropped/truncated counts run with the rows read."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from relayrl.data.images import IMAGE_PLACEHOLDER, check_images, open_row_images
from relayrl.data.rows import open_rows
from relayrl.data.vision import base_dir, image_prompt
from relayrl.errors import DataError, DataWarning
from relayrl.types import Prompt


def read_rows(path: str | Path, prompt_key: str = "prompt") -> list[tuple[str, dict[str, Any]]]:
    """Every (location, row) of a .jsonl or .parquet file or a `datasets` directory, each row checked;
    the location is `file:line` or `file:row N`."""
    rows = open_rows(path, check_row, prompt_key)
    return [rows.read(i) for i in range(len(rows))]


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
        f"found columns {sorted(row)}"
        + (f" (null: {', '.join(map(repr, nulls))})" if nulls else "")
        + ("" if set_kinds else "; if another column holds the prompt, name it with data.prompt_key")
    )


def is_plain_prompt(row: dict[str, Any]) -> bool:
    return isinstance(row.get("prompt"), str)


def chat_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat row's messages: its `messages`, or a `prompt` that is a chat list (TRL's conversational
    format, and verl's parquet files, keep the chat in `prompt`)."""
    return row["messages"] if row.get("messages") is not None else row["prompt"]


def check_row(where: str, row: dict[str, Any]) -> None:
    kind = _row_kind(where, row)
    value = row[kind]
    if kind == "messages" or isinstance(value, (list, tuple)):
        _check_messages(where, kind, value)
    elif not (isinstance(value, str) and value):
        raise DataError(
            f"{where}: 'prompt' must be a non-empty string or a list of {{role, content}} messages, got {value!r}"
        )
    check_images(where, row)  # structure and placeholder counts only: `relayrl data check` opens the files


def _check_messages(where: str, column: str, messages: Any) -> None:
    """Each message a {role, content}: content a string, or a list of `{"type": "text", "text": ...}` and
    `{"type": "image"}` parts (transformers' convention; other keys, such as the null ones a `datasets` table
    fills in, are allowed)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise DataError(f"{where}: '{column}' must be a non-empty list of {{role, content}} objects")
    for i, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), (str, list, tuple))
        ):
            raise DataError(
                f"{where}: {column}[{i}] must be an object with string 'role' and 'content' (a string or a list of "
                f"content parts), got {message!r}"
            )
        if not isinstance(message["content"], str):
            for j, part in enumerate(message["content"]):
                _check_content_part(f"{where}: {column}[{i}].content[{j}]", part)


def _check_content_part(label: str, part: Any) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "image" or (kind == "text" and isinstance(part.get("text"), str)):
        return
    if kind == "text":
        raise DataError(f"{label}: a text part needs a string 'text', got {part!r:.120}")
    raise DataError(f'{label} must be {{"type": "text", "text": ...}} or {{"type": "image"}}, got {part!r:.120}')


EAGER_ROWS = 10_000  # a file of at most this many rows is read, checked and tokenised whole at start


@dataclass
class LoadStats:
    """What loading a prompt file did: long prompts dropped or truncated, and where the first kept prompt is.
    For a file read lazily (`PromptTable`) the counts run: the distinct rows read so far."""

    dropped: int = 0
    truncated: int = 0
    first_location: str = ""
    unknown: int = 0  # prompts with a token the tokenizer could only write as its unk token


def load_prompts(
    path: str | Path,
    tokenizer,
    max_prompt_tokens: int,
    on_long_prompt: str = "error",
    chat_template: bool = True,
    prompt_key: str = "prompt",
) -> tuple[list[Prompt] | PromptTable, LoadStats]:
    """The prompts of a file and how many were dropped or truncated. Up to EAGER_ROWS rows: a list, every row
    read, checked and tokenised now (ids checked unique). More: a `PromptTable`, each row read when drawn."""
    if on_long_prompt not in ("error", "drop", "truncate"):
        raise ValueError(f"on_long_prompt must be error, drop or truncate, got {on_long_prompt!r}")
    rows, stats = open_rows(path, check_row, prompt_key), LoadStats()
    maker = PromptMaker(tokenizer, max_prompt_tokens, on_long_prompt, chat_template, stats)
    if len(rows) > EAGER_ROWS:
        return PromptTable(rows, maker), stats
    prompts, seen_ids = [], {}
    for index in range(len(rows)):
        where, row = rows.read(index)
        prompt = maker.make(index, where, row)
        if prompt is None:
            continue
        if prompt.id in seen_ids:
            raise DataError(f"{where}: id {prompt.id!r} is already used at {seen_ids[prompt.id]}; ids must be unique")
        seen_ids[prompt.id] = where
        prompts.append(prompt)
    if not prompts:
        raise DataError(f"{path}: every prompt was dropped as longer than {max_prompt_tokens} tokens")
    return prompts, stats


@dataclass
class PromptMaker:
    """One checked row -> its `Prompt` (None when dropped as too long), counted in `stats`."""

    tokenizer: Any
    max_prompt_tokens: int
    on_long_prompt: str
    chat_template: bool
    stats: LoadStats

    def make(self, index: int, where: str, row: dict[str, Any], count: bool = True) -> Prompt | None:
        tokenizer, limit = self.tokenizer, self.max_prompt_tokens
        text = render(row, tokenizer, self.chat_template, where)
        images = self._images(where, row)
        # a chat template writes its own special tokens; a plain prompt gets the tokenizer's (e.g. BOS)
        if images:
            token_ids, engine_ids, image_inputs = image_prompt(tokenizer, text, images, is_plain_prompt(row), where)
        else:
            token_ids = tokenizer(text, add_special_tokens=is_plain_prompt(row))["input_ids"]
            engine_ids, image_inputs = None, None
        if not token_ids:
            column = "'prompt'" if is_plain_prompt(row) else "'messages' (after the chat template)"
            raise DataError(f"{where}: {column} tokenizes to no tokens")
        if len(token_ids) > limit:
            if self.on_long_prompt == "error":
                raise DataError(
                    f"{where}: prompt has {len(token_ids)} tokens, over data.max_prompt_tokens="
                    f"{limit} (set data.on_long_prompt=drop or truncate to continue)"
                )
            if self.on_long_prompt == "drop":
                self.stats.dropped += count
                return None
            if images:
                raise DataError(
                    f"{where}: prompt has {len(token_ids)} tokens (its images' included), over data.max_prompt_tokens="
                    f"{limit}; a prompt with images cannot be truncated (its image tokens would be cut): raise the "
                    "limit or set data.on_long_prompt=drop"
                )
            self.stats.truncated += count
            token_ids = token_ids[-limit:]  # keep the end, where the question usually is
            text = tokenizer.decode(token_ids)
        self.stats.first_location = self.stats.first_location or where
        if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in token_ids:
            self._warn_unknown(where, text, count)
        return Prompt(
            id=str(index if row.get("id") is None else row["id"]),  # a table's missing id is null
            text=text,
            token_ids=token_ids,
            columns={k: v for k, v in row.items() if k not in ("prompt", "messages")},
            messages=None if is_plain_prompt(row) else list(chat_messages(row)),
            images=images or None,
            image_inputs=image_inputs,
            engine_token_ids=engine_ids,
        )

    def _images(self, where: str, row: dict[str, Any]) -> list:
        """The row's images, opened (relayrl/data/images.py names the row and image of any that is unreadable)."""
        if not row.get("images"):
            return []
        return open_row_images(where, row, base_dir(where))

    def _warn_unknown(self, where: str, text: str, count: bool) -> None:
        """Say once (at the first such prompt) that characters become the unk token: the model never sees
        them. A byte-level tokenizer has no unk token and never gets here."""
        first, self.stats.unknown = self.stats.unknown == 0, self.stats.unknown + count
        if not first:
            return
        warnings.warn(
            f"{where}: {shown_characters(unknown_characters(self.tokenizer, text))} not in the tokenizer's "
            "vocabulary: the prompt holds its unk token "
            f"{self.tokenizer.unk_token!r} instead (later prompts like it are counted in data/prompts_unknown_chars)",
            DataWarning,
            stacklevel=2,
        )


def unknown_characters(tokenizer, text: str) -> list[str]:
    """The characters of `text` that the tokenizer writes only as its unk token, sorted (none without one)."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return []
    return sorted({c for c in text if unk in tokenizer(c, add_special_tokens=False)["input_ids"]})


def shown_characters(characters: list[str], most: int = 10) -> str:
    """`'é', '€'` for a warning: the first `most`, then `...`."""
    if not characters:
        return "some text"
    return ", ".join(repr(c) for c in characters[:most]) + (" ..." if len(characters) > most else "")


class PromptTable:
    """The prompts of a large file, read, checked and tokenised when drawn (nothing is kept but one byte per
    row saying it was read, so `LoadStats` counts each row once). `get(i)`: row i's prompt, None if dropped.
    `table[i]`, as for the list of kept prompts: the first kept prompt from row i on (the last from the end
    for i < 0). Ids are not checked unique here (`relayrl data check` does)."""

    def __init__(self, rows, maker: PromptMaker):
        self.rows, self.maker = rows, maker
        self.read = bytearray(len(rows))

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, index: int) -> Prompt | None:
        where, row = self.rows.read(index)
        prompt = self.maker.make(index, where, row, count=not self.read[index])
        self.read[index] = 1
        return prompt

    @overload
    def __getitem__(self, index: int) -> Prompt: ...

    @overload
    def __getitem__(self, index: slice) -> list[Prompt]: ...

    def __getitem__(self, index: int | slice) -> Prompt | list[Prompt]:
        if isinstance(index, slice):
            return [p for p in map(self.get, range(*index.indices(len(self)))) if p is not None]
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of a table of {len(self)} rows")
        scan = range(index, len(self)) if index >= 0 else range(len(self) + index, -1, -1)
        for row in scan:
            prompt = self.get(row)
            if prompt is not None:
                return prompt
        raise DataError(
            f"{self.rows.path}: every prompt was dropped as longer than {self.maker.max_prompt_tokens} tokens"
        )

    def __iter__(self) -> Iterator[Prompt]:
        """Every kept prompt, in file order (each row read now: a whole pass over the file)."""
        return (p for p in map(self.get, range(len(self))) if p is not None)

    @property
    def longest(self) -> int:
        """A bound on any prompt's tokens: a longer one is refused, dropped or truncated when it is read."""
        return self.maker.max_prompt_tokens


def longest_prompt_tokens(*prompt_sets: list[Prompt] | PromptTable) -> int:
    """The most tokens a prompt of these sets has (for a lazy table, the limit it enforces)."""
    return max(
        s.longest if isinstance(s, PromptTable) else max((len(p.token_ids) for p in s), default=0) for s in prompt_sets
    )


def render(row: dict[str, Any], tokenizer, chat_template: bool, where: str = "") -> str:
    """The prompt text: `prompt` as-is, or `messages` through the chat template.

    Messages ending with a user (or tool, system) turn get the template's generation prompt; ending with an
    assistant turn, that turn is left open for the model to continue (`continue_final_message`), as TRL
    renders a conversational prompt, instead of closing it and opening a second assistant turn.
    """
    if is_plain_prompt(row):
        return row["prompt"]
    messages = list(chat_messages(row))
    if not chat_template:
        return "".join(map(_content_text, messages))
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


def _content_text(message: dict[str, Any]) -> str:
    """A message's content as text: a string as it is; a part list's texts, with `<image>` for each image."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(IMAGE_PLACEHOLDER if part["type"] == "image" else part["text"] for part in content)


def show_first_prompt(
    prompts: list[Prompt] | PromptTable, stats: LoadStats, tokenizer, key: str = "data.train", width: int = 200
) -> None:
    """Print, on one line, the first prompt exactly as the model sees it: its tokens decoded, special ones
    included, with repr escapes so newlines and spaces show; a long one keeps its start and its end."""
    first = prompts[0]  # a lazy table reads its first rows here, setting stats.first_location
    shown = tokenizer.decode(first.token_ids, skip_special_tokens=False)
    if len(repr(shown)) <= width:
        text = repr(shown)
    else:  # the end holds the generation prompt, the part most often wrong
        text = f"{shown[: width // 2]!r} ... {shown[-width // 2 :]!r} ({len(shown)} chars)"
    print(f"relayrl: first prompt ({key}, {stats.first_location}, {len(first.token_ids)} tokens): {text}")
    if isinstance(prompts, PromptTable):
        print(
            f"relayrl: {key} has {len(prompts)} rows, over {EAGER_ROWS}: each is read, checked and tokenised when "
            "first drawn, and long prompts are counted as they are read (data/prompts_* at step 0 cover the rows "
            f"read by then); `relayrl data check {prompts.rows.path}` checks every row now"
        )


class PromptSampler:
    """Deterministic epochs over the prompts: shuffled by (seed, epoch), resumable from `state()`. Over a
    `PromptTable` the order is over rows; a row dropped as too long is passed over when it is drawn.

    `replay` holds rows to hand out before the epoch order goes on: the prompts an async run had drawn but not
    yet trained when its checkpoint was written (relayrl/sources/ledger.py), which a resumed run draws again.
    They are part of `state()` (only when there are some, so a state without them reads as before)."""

    def __init__(self, prompts: list[Prompt] | PromptTable, seed: int, shuffle: bool = True):
        if not prompts:
            raise ValueError("PromptSampler needs at least one prompt")  # next() would never return
        self.prompts = prompts
        self._get = prompts.get if isinstance(prompts, PromptTable) else prompts.__getitem__
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self.replay: list[int] = []
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.prompts))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))

    def next(self, count: int) -> list[Prompt]:
        return [prompt for _, prompt in self.next_rows(count)]

    def next_rows(self, count: int) -> list[tuple[int, Prompt]]:
        """The next `count` prompts with their rows (replayed rows first)."""
        batch, dropped = [], 0
        while len(batch) < count:
            row = self._next_row()
            prompt = self._get(row)
            if prompt is not None:
                batch.append((row, prompt))
                dropped = 0
            elif (dropped := dropped + 1) > len(self._order):  # a lazy table's row dropped as too long
                raise DataError(f"every prompt was dropped: a whole epoch of {len(self._order)} rows is too long")
        return batch

    def _next_row(self) -> int:
        if self.replay:
            return self.replay.pop(0)
        if self.position == len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._epoch_order(self.epoch)
        self.position += 1
        return int(self._order[self.position - 1])

    def state(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "prompts": len(self.prompts),
            **({"replay": list(self.replay)} if self.replay else {}),
        }

    def load_state(self, state: dict) -> None:
        """Resume from `state()`; a state written over another number of prompts (data.train changed since the
        checkpoint) is refused: its rows and epoch order would name other prompts than the run drew."""
        count = len(self.prompts)
        rows = [int(row) for row in state.get("replay", [])]
        was = state.get("prompts")
        if (was is not None and was != count) or state["position"] > count or any(row >= count for row in rows):
            raise DataError(
                f"the checkpoint's prompt sampler was written over {was if was is not None else 'more'} prompts; "
                f"data.train now has {count}: the resumed run would draw other prompts than the run it continues "
                "(resume with the file the run started with, or start a new run)"
            )
        self.epoch, self.position = state["epoch"], state["position"]
        self.replay = rows
        self._order = self._epoch_order(self.epoch)
