"""The demo task: two-number addition, with a warm-start set written by a sloppy teacher.

The supervised warm start imitates a teacher who forgets the carry into the tens digit on 60% of the
problems that need one (58+67 -> "115"). The warm-started model therefore answers carry problems wrongly
more often than rightly, and greedy decoding picks the wrong answer. GRPO with an exact-match verifier
on the true sums must find and reinforce the right answer from its own samples: the held-out gain is
learned from the reward, not copied from data. The held-out split is fixed by the seed; the warm-start and RL problems are disjoint halves of the rest.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SLOPPY_RATE = 0.6


def needs_carry(a: int, b: int) -> bool:
    return a % 10 + b % 10 >= 10


def sloppy_sum(a: int, b: int) -> int:
    """The teacher's mistake: the carry from the ones digit is dropped."""
    return a + b - 10 if needs_carry(a, b) else a + b


def write_toy_task(
    out_dir: str | Path, seed: int = 0, max_operand: int = 99, eval_size: int = 500, sft_copies: int = 4
) -> dict[str, Path]:
    """Write sft.jsonl (prompt/completion), train.jsonl and eval.jsonl (prompt/answer); return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    rng.shuffle(pairs)
    held_out, rest = pairs[:eval_size], pairs[eval_size:]
    # the warm start and RL see different problems, so RL prompts are not memorised sloppy answers
    sft_pairs, train = rest[: len(rest) // 2], rest[len(rest) // 2 :]

    def problem(a: int, b: int) -> dict:
        return {"prompt": f"{a}+{b}=", "answer": str(a + b)}

    sft = []
    for _ in range(sft_copies):
        for a, b in sft_pairs:
            teacher = sloppy_sum(a, b) if needs_carry(a, b) and rng.random() < SLOPPY_RATE else a + b
            sft.append({"prompt": f"{a}+{b}=", "completion": str(teacher)})
    rng.shuffle(sft)
    paths = {"sft": out / "sft.jsonl", "train": out / "train.jsonl", "eval": out / "eval.jsonl"}
    _write_jsonl(paths["sft"], sft)
    _write_jsonl(paths["train"], [problem(a, b) for a, b in train])
    _write_jsonl(paths["eval"], [problem(a, b) for a, b in held_out])
    return paths


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)
