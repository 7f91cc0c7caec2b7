"""Data for the `vision_count` example: "How many red squares?" on 32x32 pictures (squares.py), with a warm-start
set written by a sloppy teacher.

The warm start (sft.jsonl, `messages` rows ending in the teacher's answer) imitates a teacher who loses count from
four squares on: on 60% of the pictures with four or more red squares it answers one too few. The warm-started
model therefore undercounts those pictures more often than not, and greedy decoding picks the wrong count. GRPO
with an exact-match verifier on the true counts must find and reinforce the right count from its own samples, as
in the text demo (relayrl/data/toy.py). The held-out pictures are fixed by their own seed (seed + 1000), whatever
the sizes asked for. No picture is in two splits: a hash of its pixels says which split may hold it, and a draw
that belongs to another split is dropped. Dropping the same share of every kind of picture keeps the counts
uniform (refusing pictures already drawn would not: there are only 16 pictures of one lone red square).

  python examples/vision_count/prepare.py [--out examples/vision_count/data] [--train N] [--heldout M] [--seed S]
      [--model DIR]   # also build the untrained tiny VLM there, its tokenizer trained on corpus()

Writes OUT/images/<id>.png and OUT/{train,heldout,sft}.jsonl; a row's `images` are relative to its jsonl file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
from squares import MAX_RED, draw_squares  # the sibling file: run this as a script

PROMPT = "How many red squares?"
SLOPPY_RATE = 0.6
SLOPPY_FROM = 4  # the teacher undercounts from this many red squares on
HELDOUT_SEED_OFFSET, SFT_SEED_OFFSET = 1000, 2000
SPLIT_BUCKETS = {"heldout": range(0, 10), "train": range(10, 55), "sft": range(55, 100)}  # of a picture's hash % 100


def teacher_accuracy() -> float:
    """The sloppy teacher's stated accuracy on counts drawn uniformly from 1..MAX_RED: 0.6."""
    return 1 - SLOPPY_RATE * (MAX_RED - SLOPPY_FROM + 1) / MAX_RED


def sloppy_count(count: int, rng: np.random.Generator) -> int:
    """The teacher's answer: one too few on SLOPPY_RATE of the pictures with SLOPPY_FROM or more squares."""
    return count - 1 if count >= SLOPPY_FROM and rng.random() < SLOPPY_RATE else count


def corpus() -> list[str]:
    """Every text a prompt or answer holds: the tiny VLM's character tokenizer is trained on it."""
    return [PROMPT, "0123456789"]


def user_turn() -> dict:
    return {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}


def split_of(pixels: bytes) -> str:
    """The one split a picture may be in, from a hash of its pixels."""
    bucket = int.from_bytes(hashlib.blake2b(pixels, digest_size=4).digest(), "big") % 100
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def _draw_split(out: Path, split: str, size: int, seed: int) -> list[tuple[str, int]]:
    """Draw `size` pictures of this split, save them as OUT/images/<split>-NNNNN.png; return (id, count) each."""
    rng = np.random.default_rng(seed)
    drawn = []
    while len(drawn) < size:
        image, count = draw_squares(rng)
        if split_of(image.tobytes()) != split:
            continue
        row_id = f"{split}-{len(drawn):05d}"
        image.save(out / "images" / f"{row_id}.png")
        drawn.append((row_id, count))
    return drawn


def write_task(out_dir: str | Path, train: int = 4000, heldout: int = 200, sft: int = 4000, seed: int = 0) -> dict:
    """Write the images and train.jsonl, heldout.jsonl (id, messages, images, answer) and sft.jsonl (id, messages
    with the teacher's assistant turn, images); return their paths and the teacher's accuracy on sft.jsonl."""
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    splits = {
        "train": _draw_split(out, "train", train, seed),
        "heldout": _draw_split(out, "heldout", heldout, seed + HELDOUT_SEED_OFFSET),
        "sft": _draw_split(out, "sft", sft, seed + SFT_SEED_OFFSET),
    }

    def row(row_id: str) -> dict:
        return {"id": row_id, "messages": [user_turn()], "images": [f"images/{row_id}.png"]}

    teacher_rng = np.random.default_rng(seed + SFT_SEED_OFFSET + 1)
    teacher = [(row_id, count, sloppy_count(count, teacher_rng)) for row_id, count in splits["sft"]]
    paths = {name: out / f"{name}.jsonl" for name in splits}
    for name in ("train", "heldout"):
        _write_jsonl(paths[name], [{**row(row_id), "answer": str(count)} for row_id, count in splits[name]])
    sft_rows = []
    for row_id, _, answer in teacher:
        sft_row = row(row_id)
        sft_row["messages"].append({"role": "assistant", "content": str(answer)})
        sft_rows.append(sft_row)
    _write_jsonl(paths["sft"], sft_rows)
    accuracy = sum(count == answer for _, count, answer in teacher) / max(1, len(teacher))
    return {**paths, "teacher_accuracy": accuracy}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "data"))
    parser.add_argument("--train", type=int, default=4000, help="RL prompts")
    parser.add_argument("--heldout", type=int, default=200, help="held-out prompts (fixed by the seed)")
    parser.add_argument("--sft", type=int, default=4000, help="warm-start conversations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="also build the untrained tiny VLM in this directory")
    args = parser.parse_args()
    written = write_task(args.out, args.train, args.heldout, args.sft, args.seed)
    for name in ("train", "heldout", "sft"):
        print(f"wrote {written[name]}")
    print(f"teacher accuracy on sft.jsonl: {written['teacher_accuracy']:.3f} (stated {teacher_accuracy():.3f})")
    if args.model:
        from relayrl.models.tiny_vlm import build_tiny_vlm

        build_tiny_vlm(corpus(), args.model)
        print(f"built the tiny VLM in {args.model}")


if __name__ == "__main__":
    main()
