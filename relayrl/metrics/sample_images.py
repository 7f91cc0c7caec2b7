"""The pictures of a logged sample's prompt: small PNG thumbnails kept in its `samples.jsonl` row (`images`, data
URIs), and shown beside the prompt in the report's samples table.

Kept in the row itself rather than as files beside it: a resumed run cuts samples.jsonl back to its checkpoint
(relayrl/metrics/samples.py), and a row that carries its pictures cannot be left pointing at a file of another
run. A thumbnail's longest side is at most THUMBNAIL pixels (a 1024-pixel picture costs a few KiB in the row);
smaller pictures keep their own pixels and the report scales them up without smoothing.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

THUMBNAIL = 96  # pixels, the longest side of a stored thumbnail
SHOWN_PX = 96  # the longest side the report draws a picture at
PREFIX = "data:image/png;base64,"


def thumbnails(images: list[Any] | None) -> list[str]:
    """Each PIL image as a PNG data URI, its longest side at most THUMBNAIL pixels."""
    uris = []
    for image in images or []:
        small = image.convert("RGB")
        if max(small.size) > THUMBNAIL:
            small = small.copy()
            small.thumbnail((THUMBNAIL, THUMBNAIL))
        buffer = io.BytesIO()
        small.save(buffer, format="PNG")
        uris.append(PREFIX + base64.b64encode(buffer.getvalue()).decode("ascii"))
    return uris


def images_html(row: dict) -> str:
    """The row's pictures as <img> tags for its prompt cell; a value that is not one of our PNG data URIs is
    skipped (the file is the run's, but the page must not load anything from elsewhere)."""
    tags = []
    for i, uri in enumerate(row.get("images") or []):
        if isinstance(uri, str) and uri.startswith(PREFIX):
            alt = html.escape(f"{row.get('sample', '')} image {i}")
            tags.append(f'<img class="sample-image" alt="{alt}" src="{uri}">')
    return f'<div class="sample-images">{"".join(tags)}</div>' if tags else ""


CSS = (
    f".sample-image{{display:inline-block;width:{SHOWN_PX}px;height:{SHOWN_PX}px;object-fit:contain;image-rendering:pixelated;"
    "border:1px solid #ccc;margin:0 4px 4px 0}"
)
