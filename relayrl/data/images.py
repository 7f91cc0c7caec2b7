"""The `images` column of a prompt row: its entries checked, its placeholders counted, its images opened.

A row's `images` is a list; each entry is a path (relative to the data file's directory, `images_dir`, or
absolute) or a dict `{"bytes": ..., "path": ...}` as the Hugging Face `datasets` Image feature stores it in
parquet and `save_to_disk` directories (the bytes when there are some, else the path). Each image has one
placeholder where it goes in the prompt: the text `<image>` in a `prompt` or a message's string content, or a
`{"type": "image"}` part of a message's content list (transformers' chat template convention). A row without
images is text-only: a literal `<image>` in its text stays text, but an image content part there is an error.

`check_images` is the cheap check every row read gets (structure and counts, no file opened); `open_row_images`
decodes every image now (so a missing, corrupt or truncated one fails with its row and entry); `ImageTally` sums
them up for `relayrl data check`. Left out: the model's processor (relayrl/data/vision.py).
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from relayrl.errors import DataError

IMAGE_PLACEHOLDER = "<image>"
ENTRY_KEYS = ("bytes", "path")  # the datasets Image feature's storage


def images_dir(data_path: str | Path) -> Path:
    """Where a row's relative image paths start: the directory holding the data file, or a `save_to_disk`
    directory itself (its images lie inside it)."""
    path = Path(data_path)
    return path if path.is_dir() else path.parent


def _messages(row: dict[str, Any]) -> Any:
    """The row's chat list, if it has one: `messages`, or a `prompt` holding a chat list (TRL's format)."""
    return row["messages"] if row.get("messages") is not None else row.get("prompt")


def placeholder_count(row: dict[str, Any]) -> int:
    """How many image placeholders the row's prompt holds (a checked row: see relayrl/data/source.py)."""
    messages = _messages(row)
    if isinstance(messages, str):
        return messages.count(IMAGE_PLACEHOLDER)
    count = 0
    for message in messages or []:
        content = message["content"]
        if isinstance(content, str):
            count += content.count(IMAGE_PLACEHOLDER)
        else:
            for part in content:
                count += part["type"] == "image" or (part["type"] == "text" and part["text"].count(IMAGE_PLACEHOLDER))
    return count


def has_image_parts(row: dict[str, Any]) -> bool:
    """Whether a message's content list holds a `{"type": "image"}` part."""
    messages = _messages(row)
    if isinstance(messages, str):
        return False
    return any(
        part["type"] == "image"
        for message in messages or []
        if not isinstance(message["content"], str)
        for part in message["content"]
    )


def image_entries(where: str, row: dict[str, Any]) -> list[str | dict[str, Any]]:
    """The row's `images` entries, each checked to be a path or a `{bytes, path}` dict; [] when absent or null."""
    images = row.get("images")
    if images is None:
        return []
    if not isinstance(images, (list, tuple)):
        raise DataError(
            f"{where}: 'images' must be a list of image paths or {{bytes, path}} objects, got {type(images).__name__}"
        )
    for i, entry in enumerate(images):
        _check_entry(f"{where}: images[{i}]", entry)
    return list(images)


def _check_entry(label: str, entry: Any) -> None:
    if isinstance(entry, str):
        if not entry:
            raise DataError(f"{label} is an empty path")
        return
    if not isinstance(entry, dict):
        raise DataError(f"{label} must be a path string or a {{bytes, path}} object, got {entry!r:.80}")
    if unknown := sorted(set(entry) - set(ENTRY_KEYS)):
        raise DataError(f"{label} has keys {unknown}; an image object has only 'bytes' and 'path'")
    image_bytes, path = entry.get("bytes"), entry.get("path")
    if image_bytes is not None and not isinstance(image_bytes, (bytes, bytearray)):
        raise DataError(f"{label}: 'bytes' must be bytes or null, got {type(image_bytes).__name__}")
    if path is not None and not (isinstance(path, str) and path):
        raise DataError(f"{label}: 'path' must be a non-empty string or null, got {path!r:.80}")
    if not image_bytes and path is None:
        raise DataError(f"{label} has neither 'bytes' nor 'path'")


def check_images(where: str, row: dict[str, Any]) -> None:
    """The row's images checked against its placeholders, without opening a file: with images, one placeholder
    per image; without, no image content part (a literal `<image>` in a text-only row is its text)."""
    entries = image_entries(where, row)
    if entries:
        placeholders = placeholder_count(row)
        if placeholders != len(entries):
            raise DataError(f"{where}: {_count_mismatch(len(entries), placeholders)}")
    elif has_image_parts(row):
        raise DataError(
            f'{where}: {_count_mismatch(0, placeholder_count(row))}: a {{"type": "image"}} content part needs '
            "its image in the row's 'images' list"
        )


def _count_mismatch(images: int, placeholders: int) -> str:
    return (
        f"{images} image{'' if images == 1 else 's'} but {placeholders} {IMAGE_PLACEHOLDER} "
        f"placeholder{'' if placeholders == 1 else 's'}; each image in 'images' needs one placeholder, in order, "
        f'where it goes in the prompt (the text {IMAGE_PLACEHOLDER} or a {{"type": "image"}} content part)'
    )


def open_image(label: str, entry: str | dict[str, Any], base_dir: str | Path) -> Image.Image:
    """One checked entry's image, fully decoded now, in its own mode. `label` names the row and entry."""
    image_bytes = entry.get("bytes") if isinstance(entry, dict) else None
    path = entry if isinstance(entry, str) else entry.get("path")
    resolved = None if image_bytes else Path(base_dir) / str(path)  # an absolute path stays as it is
    if resolved is not None:
        source = str(resolved)
    else:
        source = f"embedded, {len(image_bytes or b'')} bytes" + (f", path {path!r}" if path else "")
    if resolved is not None and not resolved.is_file():
        raise DataError(f"{label} ({source}): file not found" + (" (a directory)" if resolved.is_dir() else ""))
    try:
        with Image.open(resolved if resolved is not None else io.BytesIO(image_bytes or b"")) as image:
            image.load()  # decode now: a truncated file fails here, not later in the processor
            return image
    except Image.UnidentifiedImageError:
        raise DataError(f"{label} ({source}): not an image Pillow can read (unknown format or corrupt)") from None
    except Image.DecompressionBombError as err:
        raise DataError(f"{label} ({source}): too large to open: {err}") from None
    except (OSError, SyntaxError, ValueError) as err:  # PIL raises these for truncated and broken files
        raise DataError(f"{label} ({source}): corrupt or truncated image: {err}") from None


def open_row_images(where: str, row: dict[str, Any], base_dir: str | Path) -> list[Image.Image]:
    """Every image of the row, decoded now and converted to RGB, after `check_images` (paths resolved against
    `base_dir` unless absolute). A bad one raises DataError naming `where`, the entry, its path and why."""
    check_images(where, row)
    return [
        open_image(f"{where}: images[{i}]", entry, base_dir).convert("RGB")
        for i, entry in enumerate(image_entries(where, row))
    ]


def image_summary(images: list[Image.Image]) -> str:
    """`3 images in 1 row, 8x8 to 640x480, modes RGB, L` (width x height)."""
    tally = ImageTally()
    tally.add(images)
    return tally.summary()


@dataclass
class ImageTally:
    """Images seen over many rows: how many, in how many rows, their smallest and largest size, their modes."""

    images: int = 0
    rows: int = 0
    smallest: tuple[int, int] | None = None  # (width, height), by pixel count
    largest: tuple[int, int] | None = None
    modes: Counter = field(default_factory=Counter)

    def add(self, images: list[Image.Image]) -> None:
        self.images += len(images)
        self.rows += bool(images)
        for image in images:
            self.modes[image.mode] += 1
            area = image.width * image.height
            if self.smallest is None or area < self.smallest[0] * self.smallest[1]:
                self.smallest = image.size
            if self.largest is None or area > self.largest[0] * self.largest[1]:
                self.largest = image.size

    def summary(self) -> str:
        if not self.images or self.smallest is None or self.largest is None:
            return "no images"
        small, large = "x".join(map(str, self.smallest)), "x".join(map(str, self.largest))
        sizes = small if small == large else f"{small} to {large}"
        modes = ", ".join(mode for mode, _ in self.modes.most_common())
        rows = f"{self.rows} row{'' if self.rows == 1 else 's'}"
        return f"{self.images} image{'' if self.images == 1 else 's'} in {rows}, {sizes}, modes {modes}"
