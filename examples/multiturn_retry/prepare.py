"""Data for the `retry` example: two-number addition where a wrong answer hears "no=" and may try again.

The warm start (sft.jsonl, multi-turn `messages` rows) imitates a sloppy teacher: on problems with a carry
into the tens it forgets the carry 60% of the time (58+67 -> 115); told "no=", it gets it right 30% of the
time (`--retry-right`) and otherwise errs the other way (125). The warm-started model therefore fails often on
carries, on the first attempt and on the second (at 50% the warm start already solved 0.82 in two turns, which
left RL too little room to show a 10-point rise reliably). RL with the `retry` environment (reward discounted per turn: a first-attempt
success is worth more) must find the right answers from its own samples. train.jsonl / eval.jsonl hold
`prompt` and `answer`; held-out problems are disjoint from the warm start's and RL's.

  python examples/multiturn_retry/prepare.py [--out examples/multiturn_retry/data]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FEEDBACK = "no="  # env.kwargs.feedback in config.yaml


def carry(a: int, b: int) -> bool:
    return a % 10 + b % 10 >= 10


def conversation(a: int, b: int, rng: random.Random, retry_right: float) -> dict:
    turns = [{"role": "user", "content": f"{a}+{b}="}]
    if not (carry(a, b) and rng.random() < 0.6):
        return {"messages": turns + [{"role": "assistant", "content": str(a + b)}]}
    retry = a + b if rng.random() < retry_right else a + b + 10
    return {
        "messages": turns
        + [
            {"role": "assistant", "content": str(a + b - 10)},
            {"role": "user", "content": FEEDBACK},
            {"role": "assistant", "content": str(retry)},
        ]
    }


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "data"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-size", type=int, default=300)
    parser.add_argument("--retry-right", type=float, default=0.3, help="how often the teacher's second try is right")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    pairs = [(a, b) for a in range(100) for b in range(100)]
    rng.shuffle(pairs)
    held_out, rest = pairs[: args.eval_size], pairs[args.eval_size :]
    sft, train = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    write(out / "sft.jsonl", [conversation(a, b, rng, args.retry_right) for a, b in sft])
    write(out / "train.jsonl", [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in train])
    write(out / "eval.jsonl", [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in held_out])
    print(f"wrote {out}/sft.jsonl ({len(sft)}), train.jsonl ({len(train)}), eval.jsonl ({len(held_out)})")


if __name__ == "__main__":
    main()
