"""Prompt lengths the planner reads from `data.train` before a run: a sample of rows rendered and tokenised
exactly as training does (relayrl/data: `open_rows`, the chat template, `PromptMaker`), never the whole file.

A batch pads its rows to its longest prompt, and a batch of k prompts drawn from the file has as its longest,
on average, about the k/(k+1) quantile of the prompt lengths: that is the `batch_longest` the learner's
width is sized with. The engine does not pad: prefill counts the mean. Rows over data.max_prompt_tokens are
counted as the run would keep them (truncated to the limit; dropped ones left out). Left out: reading every
row of a large file (`relayrl data check` does), response lengths (no model has answered yet: the report
says which it assumed).

Rows with images: `PromptMaker` tokenises them through the model's processor, which expands each `<image>` into
the image's tokens (relayrl/data/vision.py), so every length here already counts the image tokens, as the
learner and the engine see them. The sample also counts each row's `images` and the image tokens among its ids
(the vision encoder's work per prompt, relayrl/planner/vision.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import DataConfig

SAMPLE_ROWS = 512  # rows read, spread evenly over the file


@dataclass(frozen=True)
class PromptLengths:
    rows: int  # rows in data.train
    sampled: int  # rows read
    mean: float
    p95: float
    longest: int  # the longest sampled prompt
    batch_longest: float  # expected longest prompt of a batch of `batch` prompts
    batch: int  # prompts_per_step
    source: str  # data.train
    images: float = 0.0  # mean images per sampled prompt (the rows' `images`)
    image_tokens: float = 0.0  # mean image tokens per sampled prompt (counted in the lengths above)


def quantile(sorted_lengths: list[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on a sorted list."""
    position = q * (len(sorted_lengths) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_lengths) - 1)
    return sorted_lengths[low] + (sorted_lengths[high] - sorted_lengths[low]) * (position - low)


def sample_prompt_lengths(
    data: DataConfig, model_path: str, batch: int, sample: int = SAMPLE_ROWS
) -> PromptLengths | str:
    """Prompt lengths of `data.train` through the tokenizer of the model at `model_path`, or why they could not be
    read; `batch`: the prompts of a step (`rollout.prompts_per_step`), whose longest is estimated."""
    from relayrl.data.rows import open_rows
    from relayrl.data.source import LoadStats, PromptMaker, check_row
    from relayrl.errors import DataError, ModelError
    from relayrl.models.loading import load_tokenizer

    if not data.train:
        return "no data.train"
    try:
        tokenizer = load_tokenizer(model_path)
        rows = open_rows(data.train, check_row, data.prompt_key)
    except (ModelError, DataError, OSError) as err:
        return str(err).splitlines()[0][:120]
    on_long = "truncate" if data.on_long_prompt == "error" else data.on_long_prompt
    maker = PromptMaker(tokenizer, data.max_prompt_tokens, on_long, data.chat_template, LoadStats())
    lengths, images, image_tokens = _sample(maker, rows, sample)
    if not lengths:
        return f"every sampled prompt of {data.train} is over data.max_prompt_tokens"
    lengths.sort()
    return PromptLengths(
        rows=len(rows),
        sampled=len(lengths),
        mean=sum(lengths) / len(lengths),
        p95=quantile(lengths, 0.95),
        longest=lengths[-1],
        batch_longest=quantile(lengths, batch / (batch + 1)),
        batch=batch,
        source=str(data.train),
        images=images / len(lengths),
        image_tokens=image_tokens / len(lengths),
    )


def _sample(maker, rows, sample: int) -> tuple[list[int], int, int]:
    """(token lengths, images, image tokens) of up to `sample` rows spread evenly over `rows`, dropped ones out."""
    from relayrl.data.vision import image_token_count

    step = max(1, len(rows) // sample)
    lengths, images, image_tokens = [], 0, 0
    for index in range(0, len(rows), step)[:sample]:
        prompt = maker.make(index, *rows.read(index))
        if prompt is None:
            continue
        lengths.append(len(prompt.token_ids))
        if prompt.images:
            images += len(prompt.images)
            image_tokens += image_token_count(prompt.token_ids, maker.tokenizer)
    return lengths, images, image_tokens
