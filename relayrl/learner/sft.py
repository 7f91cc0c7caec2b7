"""Supervised warm start on any jsonl/parquet of `prompt`/`completion` pairs.

Loss on the completion tokens (and the end-of-sequence token) only. `init="tiny"` trains a character
tokenizer on the data and builds a tiny Llama-style model for it, so the whole thing runs offline; or
start from an existing model directory. The result is a `save_pretrained` directory that vLLM and
transformers both load. Characters an existing model's tokenizer lacks would be trained on as its unknown
token; they are named in one warning (with how many rows and the first), not refused: a few stray symbols
should not stop a warm start, but the user must know what was learned.

A batch whose rows differ much in length (tool-calling conversations beside plain answers) runs as a few
length-sorted micro-batches, each padded to its own longest row, with the same gradient: every token's loss is
divided by the whole batch's count (`length_groups`).
"""

from __future__ import annotations

import math
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from relayrl.data.source import read_rows
from relayrl.errors import DataError, RelayWarning


@dataclass
class SFTSettings:
    epochs: float = 3.0
    lr: float = 1e-3
    batch_size: int = 64
    warmup_steps: int = 20
    seed: int = 0
    hidden: int = 128
    layers: int = 3


class Pair(NamedTuple):
    where: str  # `file:line` or `file:row N`, for messages about this row
    prompt: str
    completion: str


def load_pairs(path: str | Path) -> list[Pair]:
    pairs = []
    for where, row in read_rows(path):
        completion = row.get("completion")
        if not isinstance(completion, str) or not completion:
            raise DataError(f"{where}: an SFT row needs a non-empty string 'completion', got {completion!r}")
        if row.get("prompt") is None:
            raise DataError(f"{where}: an SFT row needs a 'prompt' string")
        pairs.append(Pair(where, row["prompt"], completion))
    return pairs


# One training example: token ids, and the prompt's length (a pair) or each token's trained flag (a conversation)
Encoded = tuple[list[int], int | list[bool]]


def encode(pairs: list[Pair], tokenizer) -> list[tuple[list[int], int]]:
    """(token ids of prompt + completion + eos, prompt length) per pair."""
    out = []
    for pair in pairs:
        p = tokenizer(pair.prompt)["input_ids"]  # with the tokenizer's special tokens, as prompts are at RL time
        c = tokenizer(pair.completion, add_special_tokens=False)["input_ids"]
        out.append((p + c + [tokenizer.eos_token_id], len(p)))
    return out


def warn_unknown_characters(pairs: list[Pair], encoded: list[Encoded], tokenizer, model: str) -> None:
    """One warning naming the characters that became the unknown token, how many rows have them, the first."""
    unk = tokenizer.unk_token_id
    if unk is None:  # byte-level vocabularies have no unknown token: every character is encodable
        return
    rows = [pair for pair, (ids, _) in zip(pairs, encoded) if unk in ids]
    if not rows:
        return
    known: dict[str, bool] = {}
    lacking: list[str] = []
    for pair in rows:
        for char in pair.prompt + pair.completion:
            if char not in known:
                known[char] = unk not in tokenizer(char, add_special_tokens=False)["input_ids"]
                if not known[char]:
                    lacking.append(char)
    shown = ", ".join(map(repr, lacking[:20])) + (f" and {len(lacking) - 20} more" if len(lacking) > 20 else "")
    shown = shown or "no single character, but whole pieces"  # a word-level vocabulary
    warnings.warn(
        f"{len(rows)} of {len(pairs)} rows have text the tokenizer of {model} lacks ({shown}), "
        f"trained on as {tokenizer.unk_token} (first at {rows[0].where}); "
        "clean them from the data, use a model whose tokenizer has them, or --init tiny (a vocabulary "
        "built from the data)",
        RelayWarning,
        stacklevel=3,
    )


def collate(batch: list[Encoded], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for row, (ids, prompt_len) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        if isinstance(prompt_len, list):  # a conversation: a trained flag per token (learner/sft_chat.py)
            labels[row, : len(ids)] = torch.where(torch.tensor(prompt_len), torch.tensor(ids), -100)
            continue
        labels[row, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
    return input_ids, attention, labels


SPLIT_SAVING = 0.2  # split a batch only when that drops at least this share of its padded positions
MOST_GROUPS = 4
ENOUGH = 1.1  # the fewest groups that pad at most 10% more positions than the most would


def length_groups(lengths: list[int], most: int = MOST_GROUPS) -> list[list[int]]:
    """The batch's row indices as at most `most` groups of similar length: contiguous cuts of the rows sorted by
    length that pad the fewest positions (each group to its own longest row; the fewest groups within ENOUGH of
    that), or one group when cutting would save less than SPLIT_SAVING of them (near-equal rows stay one forward)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sizes = [lengths[i] for i in order]
    n, budget = len(sizes), (1 - SPLIT_SAVING) * len(sizes) * sizes[-1]
    if sum(sizes) > budget:  # even one group per row would pad too much to be worth a second forward
        return [order]
    ends = [j for j in range(1, n + 1) if j == n or sizes[j] != sizes[j - 1]]  # a cut only between two lengths
    # best[k][e]: fewest padded positions of the rows before ends[e] in k groups; start[k][e]: its last group's start
    best = [[math.inf] * len(ends) for _ in range(most + 1)]
    start = [[0] * len(ends) for _ in range(most + 1)]
    for k in range(1, most + 1):
        for e, j in enumerate(ends):
            for b, i in [(-1, 0)] * (k == 1) + [(b, ends[b]) for b in range(e)] * (k > 1):
                cost = (best[k - 1][b] if b >= 0 else 0) + (j - i) * sizes[j - 1]
                if cost < best[k][e]:
                    best[k][e], start[k][e] = cost, b
    fewest = min(best[k][-1] for k in range(1, most + 1))
    k = next(k for k in range(1, most + 1) if best[k][-1] <= ENOUGH * fewest)  # a forward more must earn its keep
    if best[k][-1] > budget:
        return [order]
    groups, e = [], len(ends) - 1
    for level in range(k, 0, -1):
        b = start[level][e]
        groups.append(order[ends[b] if b >= 0 else 0 : ends[e]])
        e = b
    return groups[::-1]


def sft_loss(model, batch: list[Encoded], pad_id: int, pixels: dict) -> torch.Tensor:
    """The batch's mean token loss, backpropagated group by group (length_groups); returned detached."""
    groups = [list(range(len(batch)))] if pixels else length_groups([len(ids) for ids, _ in batch])
    if len(groups) == 1:
        input_ids, attention, labels = collate(batch, pad_id)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels, **pixels).loss
        loss.backward()
        return loss.detach()
    parts = [collate([batch[i] for i in group], pad_id) for group in groups]
    counted = sum(int((labels[:, 1:] != -100).sum()) for _, _, labels in parts)  # the positions a loss is taken at
    total = torch.zeros(())
    for input_ids, attention, labels in parts:
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels, num_items_in_batch=counted).loss
        loss.backward()
        total += loss.detach()
    return total


def run_sft(
    data: str | Path,
    out: str | Path,
    init: str = "tiny",
    model_path: str | None = None,
    settings: SFTSettings | None = None,
    log=print,
) -> Path:
    from relayrl.learner import sft_vision
    from relayrl.learner.sft_chat import conversation_rows, conversation_texts, encode_conversations
    from relayrl.models.loading import load_causal_lm, load_tokenizer
    from relayrl.models.tiny import build_tiny

    settings = settings or SFTSettings()
    with_images = sft_vision.image_rows(data)  # prompts with images (learner/sft_vision.py)
    conversations = None if with_images else conversation_rows(data)  # multi-turn: assistant turns (sft_chat.py)
    pairs = [] if conversations or with_images else load_pairs(data)
    torch.manual_seed(settings.seed)
    if model_path:
        model = load_causal_lm(model_path, key="--model")
        tokenizer = load_tokenizer(model_path, key="--model")
    elif init == "tiny" and with_images:
        model, tokenizer = sft_vision.build_tiny_for(with_images, settings.seed, settings.hidden, settings.layers)
    elif init == "tiny":
        texts = [pair.prompt + pair.completion for pair in pairs] + conversation_texts(conversations or [])
        model, tokenizer = build_tiny(texts, seed=settings.seed, hidden=settings.hidden, layers=settings.layers)
    else:
        raise ValueError(f"unknown init {init!r}: use 'tiny' or give a model path")
    encoded: list[Encoded] = []
    images: list[dict] = []  # each row's image tensors, for image rows
    if with_images:
        pieces, images = sft_vision.encode_image_rows(with_images, tokenizer)
        encoded += pieces
    else:
        encoded += encode_conversations(conversations, tokenizer) if conversations else encode(pairs, tokenizer)
    warn_unknown_characters(pairs, encoded, tokenizer, model_path or "--init tiny")
    steps = max(1, math.ceil(len(encoded) * settings.epochs / settings.batch_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / settings.warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))),
    )
    rng = random.Random(settings.seed)
    order: list[int] = []
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        if len(order) < settings.batch_size:
            fresh = list(range(len(encoded)))
            rng.shuffle(fresh)
            order.extend(fresh)
        picked = order[: settings.batch_size]
        batch = [encoded[i] for i in picked]
        del order[: settings.batch_size]
        pixels = sft_vision.image_batch(images, picked) if images else {}
        loss = sft_loss(model, batch, int(tokenizer.pad_token_id), pixels)  # pyright: ignore[reportArgumentType] - an int here
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"sft step {step + 1}/{steps}  loss {loss.item():.4f}  {time.perf_counter() - start:.0f}s")
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if with_images:
        sft_vision.save_processor(tokenizer, out)
    return out
