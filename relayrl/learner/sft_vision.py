"""Warm starts on image rows: `relayrl sft` on `messages` rows with `images`, the assistant's answer trained.

A row is a prompt with images (the user turn's content parts, as RL prompts are: relayrl/data/vision.py) and one
assistant turn. The prompt is tokenised exactly as an RL prompt is (the chat template, then the model's processor
expanding each image placeholder) and the answer as the model emits it (its content and the end-of-turn suffix up to
the end-of-sequence token); only the answer's tokens are trained. `--init tiny` on such a file builds a tiny
vision-language model (relayrl/models/tiny_vlm.py) whose vocabulary is the rows' text. Several assistant turns in
an image row are refused by name (multi-turn image warm starts are not built yet).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from relayrl.data.chat import ChatCodec
from relayrl.data.images import open_row_images
from relayrl.data.source import read_rows, render
from relayrl.data.vision import base_dir, image_prompt
from relayrl.errors import DataError

ImageRow = tuple[str, list[dict[str, Any]], list]  # (location, messages, opened images)


def image_rows(path: str | Path) -> list[ImageRow] | None:
    """The file's rows when they carry images (every row must then), else None."""
    rows = read_rows(path)
    if not rows or not rows[0][1].get("images"):
        return None
    out = []
    for where, row in rows:
        messages = row.get("messages")
        if not row.get("images"):
            raise DataError(f"{where}: an image SFT file's rows all need 'images' (the first row has them)")
        if not isinstance(messages, list) or [m["role"] for m in messages].count("assistant") != 1:
            raise DataError(f"{where}: an image SFT row needs 'messages' with exactly one assistant turn, the last")
        if messages[-1]["role"] != "assistant" or not isinstance(messages[-1]["content"], str):
            raise DataError(f"{where}: the assistant turn of an image SFT row must be the last, its content a string")
        out.append((where, messages, open_row_images(where, row, base_dir(where))))
    return out


def image_row_texts(rows: list[ImageRow]) -> list[str]:
    """Every text of the rows (a tiny model's character vocabulary is trained on them)."""
    texts = []
    for _, messages, _ in rows:
        for message in messages:
            content = message["content"]
            parts = [content] if isinstance(content, str) else [p.get("text") or "" for p in content]
            texts += parts
    return texts


def encode_image_rows(rows: list[ImageRow], tokenizer) -> tuple[list[tuple[list[int], int]], list[dict]]:
    """(ids of prompt + answer, prompt length) per row, and each row's image tensors."""
    codec = ChatCodec(tokenizer)
    suffix, eos = codec.assistant_suffix, tokenizer.eos_token or ""
    stop = suffix.find(eos) + len(eos) if eos and eos in suffix else len(suffix)
    encoded, images = [], []
    for where, messages, opened in rows:
        text = render({"messages": messages[:-1]}, tokenizer, True, where)
        prompt_ids, _, inputs = image_prompt(tokenizer, text, opened, False, where)
        answer = codec.encode(messages[-1]["content"] + suffix[:stop])
        if not codec.templated and tokenizer.eos_token_id is not None:
            answer.append(tokenizer.eos_token_id)
        encoded.append((prompt_ids + answer, len(prompt_ids)))
        images.append(inputs)
    return encoded, images


def build_tiny_for(rows: list[ImageRow], seed: int, hidden: int, layers: int):
    """A tiny vision-language model and its tokenizer for these rows (built in a scratch directory, loaded back)."""
    import tempfile

    from relayrl.data.vision import load_processor
    from relayrl.models.loading import load_causal_lm
    from relayrl.models.tiny_vlm import build_tiny_vlm

    scratch = tempfile.mkdtemp(prefix="relayrl-tiny-vlm-")
    build_tiny_vlm(image_row_texts(rows), scratch, seed=seed, hidden=hidden, layers=layers)
    return load_causal_lm(scratch, key="--init tiny"), load_processor(scratch).tokenizer


def save_processor(tokenizer, out: str | Path) -> None:
    """The processor beside the trained weights (the RL run's engines and prompts load it from there)."""
    from relayrl.data.vision import processor_for

    processor_for(tokenizer).save_pretrained(out)


def image_batch(images: list[dict], index: list[int]) -> dict[str, torch.Tensor]:
    from relayrl.types import ImageBatch

    return ImageBatch([images[i] for i in index]).batch()
