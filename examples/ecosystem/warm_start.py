"""A warm start that RL can improve, for the reasoning-gym and skyrl-gym examples' learning runs.

A tiny model is trained (`relayrl sft`) on reasoning-gym's own `chain_sum` questions (two one-digit terms,
`+` and `-`), answered by a sloppy teacher: on 60% of the questions whose ones digits carry or borrow, the teacher
drops the carry (7 + 5 -> 2, 3 - 5 -> 8). Greedy decoding of the warm model then often gives the sloppy
answer; the task's own scorer (reasoning-gym) or environment (skyrl-gym's gsm8k_multi_turn, answers after `#### `)
rewards the right one, and RL finds it among the samples. The SFT rows use seed 100, the RL and held-out rows the
examples' seeds 0 and 1; with one-digit terms there are only 200 distinct questions, so the three sets share
questions: what RL must undo is the teacher's habit on them (the demo, relayrl/data/toy.py, keeps them disjoint).

  python examples/ecosystem/warm_start.py --format plain   # -> runs/ecosystem_warm   (reasoning_gym_learn.yaml)
  python examples/ecosystem/warm_start.py --format gsm8k_work --init runs/ecosystem_warm --epochs 8
                                                           # -> runs/ecosystem_warm_gsm8k_work (skyrl_gym_learn.yaml)
The gsm8k formats start from the plain warm start, its tokenizer given the `#` it lacks. `gsm8k_work` answers
`N #### N`: the answer where the plain warm start learned it, then stated after `#### ` (as GSM8K's solutions end
with it), so the SFT only adds the copy; 8 epochs leave greedy decoding with the teacher's errors only (about 0.73
on the held-out rows). `gsm8k` (`#### N`) moves the answer five tokens on, and from the plain warm start the model
must learn it again: with 4 or 8 epochs it stayed near its loss plateau (0.12-0.43 greedy), a bad warm start.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

SLOPPY_RATE = 0.6
TASK = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def sloppy(question: str, answer: str, rng: random.Random) -> str:
    """The teacher's answer: the true one, or on a carry/borrow question (60%) the one with the carry dropped."""
    a, op, b = re.search(r"(\d+) ([+-]) (\d+) =$", question).groups()
    a, b = int(a), int(b)
    carries = (a % 10 + b % 10 >= 10) if op == "+" else (a % 10 < b % 10)
    if carries and rng.random() < SLOPPY_RATE:
        return str(int(answer) - 10 if op == "+" else int(answer) + 10)
    return answer


def sft_rows(size: int, answer_format: str, seed: int = 100) -> list[dict]:
    import reasoning_gym

    rng = random.Random(seed)
    rows = []
    for item in reasoning_gym.create_dataset("chain_sum", size=size, seed=seed, **TASK):
        answer = sloppy(item["question"], item["answer"], rng)
        completions = {"plain": f" {answer}", "gsm8k": f" #### {answer}", "gsm8k_work": f" {answer} #### {answer}"}
        completion = completions[answer_format]
        rows.append({"prompt": item["question"], "completion": completion})
    return rows


def with_characters(model_dir: str, characters: str, out: Path) -> str:
    """`model_dir` with the characters its tokenizer lacks added as tokens (new embedding rows), written to `out`:
    the plain warm start's vocabulary has no `#`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    missing = [c for c in characters if tokenizer.convert_tokens_to_ids(c) in (None, tokenizer.unk_token_id)]
    if not missing:
        return model_dir
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer.add_tokens(missing)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def main() -> None:
    from relayrl.learner.sft import SFTSettings, run_sft

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--format",
        choices=("plain", "gsm8k", "gsm8k_work"),
        default="plain",
        help="answer as 'N', '#### N', or 'N #### N' (the answer worked out first, then stated after '#### ', as "
        "GSM8K's solutions end: the answer keeps the plain warm start's position)",
    )
    parser.add_argument("--size", type=int, default=3000, help="SFT rows")
    parser.add_argument("--epochs", type=float, default=24.0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", default="")
    parser.add_argument("--init", default="", help="a model directory to start from (default: a new tiny model)")
    args = parser.parse_args()
    out = Path(args.out or ("runs/ecosystem_warm" if args.format == "plain" else f"runs/ecosystem_warm_{args.format}"))
    data = out.with_name(out.name + "_sft.jsonl")
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(row) + "\n" for row in sft_rows(args.size, args.format)))
    settings = SFTSettings(epochs=args.epochs, lr=args.lr, batch_size=128)
    init = args.init and with_characters(args.init, "#", out.with_name(out.name + "_init"))
    run_sft(data, out, init="tiny", model_path=init or None, settings=settings)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
