"""Data for the `calculator` example: three-digit addition, with a calculator the model may call.

A turn `<calc>123+456</calc>` is answered by the environment (" is 579.") and the model then answers "579". A
tiny model cannot add three-digit numbers in its head: the warm start (sft.jsonl, multi-turn `messages` rows)
shows the calculator used on only 30% of the problems and a direct answer, often wrong in a digit, on the rest.
RL with the `calculator` environment rewards a correct final answer, so it must learn to call the tool.
train.jsonl / eval.jsonl hold `prompt` and `answer`.

  python examples/multiturn_calculator/prepare.py [--out examples/multiturn_calculator/data]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

REPLY = " is {}."  # env.kwargs.reply in config.yaml
TOOL_SHARE = 0.3


def guess(total: int, rng: random.Random) -> int:
    """A mental sum: right 30% of the time, else off by 1, 10 or 100."""
    return total if rng.random() < 0.3 else total + rng.choice([-100, -10, -1, 1, 10, 100])


def conversation(a: int, b: int, rng: random.Random) -> dict:
    turns = [{"role": "user", "content": f"{a}+{b}="}]
    if rng.random() >= TOOL_SHARE:
        return {"messages": turns + [{"role": "assistant", "content": str(guess(a + b, rng))}]}
    return {
        "messages": turns
        + [
            {"role": "assistant", "content": f"<calc>{a}+{b}</calc>"},
            {"role": "tool", "content": REPLY.format(a + b)},
            {"role": "assistant", "content": str(a + b)},
        ]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "data"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-size", type=int, default=4000)
    parser.add_argument("--train-size", type=int, default=4000)
    parser.add_argument("--eval-size", type=int, default=300)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    sizes = (args.sft_size, args.train_size, args.eval_size)
    pairs = rng.sample([(a, b) for a in range(100, 1000) for b in range(100, 1000)], sum(sizes))
    sft, train, held_out = pairs[: sizes[0]], pairs[sizes[0] : sizes[0] + sizes[1]], pairs[sizes[0] + sizes[1] :]
    rows = {
        "sft": [conversation(a, b, rng) for a, b in sft],
        "train": [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in train],
        "eval": [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in held_out],
    }
    for name, items in rows.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in items))
    print(f"wrote {out}/sft.jsonl ({len(sft)}), train.jsonl ({len(train)}), eval.jsonl ({len(held_out)})")


if __name__ == "__main__":
    main()
