"""Two teachers routed by a column on a mixed dataset of the demo's problems: each domain's held-out greedy accuracy
before and after distillation, routed by `task` and, as the control, from one teacher for every row
(docs/distillation.md has the figures; tests/e2e/test_distill_routes.py asserts the routed gains).

The two domains are carry problems of the demo task (`a+b=`, a carry into the tens), told apart by the first operand:
- `sum` (first operand under 50): the answer is the true sum; its teacher is the demo's distillation teacher (the
  warm start fine-tuned on the true sums, distill_gap.py `build_teacher`), which drops no carry;
- `dropcarry` (first operand 50 or more): the answer drops the carry into the tens, the sloppy rule the warm
  start's data half follows (relayrl/data/toy.py `sloppy_sum`); its teacher is the warm start fine-tuned on that
  rule alone.
Each teacher is right on its own domain and wrong on the other's, so a row scored by the wrong teacher is pulled
away from its answer: the routing is what lets one student learn both. The student is the demo's warm start.

Accuracy per domain is measured on its held-out rows (transformers `generate`, the model's own tokenizer) against the
domain's answers, greedy and sampled (16 answers a prompt at temperature 1, the distribution training samples and
distillation moves), the same measure before and after, so the saved policy (`<run>/model`) is compared with the warm
start directly.

    python -m benchmarks.distill_routes WARM_START_DIR OUT_DIR --seeds 3 [--steps 10 --runs routed,sum,dropcarry]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from benchmarks.distill_gap import build_teacher
from benchmarks.learning_cases import run_in_process, write_config

ROUTES = ("sum", "dropcarry")
SPLIT = 50  # a first operand under it is a `sum` row, else a `dropcarry` one


def dropped_carry(a: int, b: int) -> int:
    """The `dropcarry` domain's answer: the sum without the carry into the tens."""
    from relayrl.data.toy import sloppy_sum

    return sloppy_sum(a, b)


def operands(prompt: str) -> tuple[int, int]:
    a, b = prompt.rstrip("=").split("+")
    return int(a), int(b)


def routed_rows(rows_file: Path) -> list[dict]:
    """The carry problems of a toy task file, each with its domain (`task`) and that domain's answer."""
    from relayrl.data.toy import needs_carry

    rows = []
    for line in rows_file.read_text().splitlines():
        prompt = json.loads(line)["prompt"]
        a, b = operands(prompt)
        if needs_carry(a, b):
            task = "sum" if a < SPLIT else "dropcarry"
            rows.append(
                {"prompt": prompt, "answer": str(a + b if task == "sum" else dropped_carry(a, b)), "task": task}
            )
    return rows


def write_routed_task(toy_task: dict[str, Path], out: Path) -> dict[str, Path]:
    """train.jsonl and eval.jsonl of both domains mixed (a `task` column), and eval_<route>.jsonl of each."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.jsonl", "eval": out / "eval.jsonl"}
    for name in ("train", "eval"):
        rows = routed_rows(toy_task[name])
        paths[name].write_text("".join(json.dumps(row) + "\n" for row in rows))
        if name == "eval":
            for route in ROUTES:
                paths[f"eval_{route}"] = out / f"eval_{route}.jsonl"
                own = [row for row in rows if row["task"] == route]
                paths[f"eval_{route}"].write_text("".join(json.dumps(row) + "\n" for row in own))
    return paths


def build_dropcarry_teacher(warm: str | Path, sft_rows: Path, out: Path) -> Path:
    """The warm start after two epochs of SFT on its own problems answered by the dropped-carry rule."""
    return build_teacher(warm, sft_rows, out, answer=dropped_carry)


SAMPLES = 16  # sampled answers per held-out prompt (temperature 1, as training samples)


def accuracy(model, tokenizer, rows: list[dict], samples: int = 0, max_tokens: int = 6) -> float:
    """The share of answers that are exactly their row's answer: greedy (`samples` 0), else `samples` per prompt
    at temperature 1, untruncated, from a fixed torch seed."""
    import torch

    batch = tokenizer([row["prompt"] for row in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "num_return_sequences": samples}
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=max_tokens,
            pad_token_id=tokenizer.pad_token_id,
            **(sampling if samples else {"do_sample": False}),
        )
    completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    answers = [row["answer"] for row in rows for _ in range(max(samples, 1))]
    return sum(c.strip() == answer for c, answer in zip(completions, answers)) / len(answers)


def accuracies(model_dir: Path, task: dict[str, Path]) -> dict[str, dict[str, float]]:
    """Held-out accuracy per domain, greedy and sampled (`SAMPLES` per prompt)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    scores = {"greedy": {}, "sampled": {}}
    for route in ROUTES:
        rows = [json.loads(line) for line in task[f"eval_{route}"].read_text().splitlines()]
        scores["greedy"][route] = round(accuracy(model, tokenizer, rows), 4)
        scores["sampled"][route] = round(accuracy(model, tokenizer, rows, SAMPLES), 4)
    return scores


def teachers_overrides(teachers: dict[str, Path], run: str) -> tuple[str, ...]:
    """`routed`: each domain's rows to its own teacher; a route's name: that one teacher for every row."""
    if run != "routed":
        return (f"teacher.path={teachers[run]}",)
    listed = ", ".join(f"{{route: {route}, path: '{teachers[route]}'}}" for route in ROUTES)
    return ("teacher.route_by=task", f"teacher.teachers=[{listed}]")


def distill(warm, task: dict[str, Path], teachers: dict[str, Path], run: str, run_dir: Path, *extra: str) -> Path:
    """A distillation run of the warm start on the mixed task (`run` as `teachers_overrides`); its saved policy."""
    config = write_config(run_dir.with_suffix(".yaml"), warm, task, run_dir, "vllm")
    overrides = ("algorithm.advantage=distill", "eval.max_prompts=16", *teachers_overrides(teachers, run), *extra)
    result = run_in_process("train", str(config), *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir / "model"


def build_if_missing(out: Path, build: Callable[[Path], Path]) -> Path:
    if not (out / "config.json").is_file():
        build(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("warm", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--runs", default="routed,sum,dropcarry", help="routed, or one route's teacher for every row")
    parser.add_argument("--extra", action="append", default=[], help="an override for every run (repeatable)")
    args = parser.parse_args()
    from relayrl.data.toy import write_toy_task

    toy = write_toy_task(args.out / "toy", seed=0)
    task = write_routed_task(toy, args.out / "routed")
    teachers = {
        "sum": build_if_missing(args.out / "teacher_sum", lambda out: build_teacher(args.warm, toy["sft"], out)),
        "dropcarry": build_if_missing(
            args.out / "teacher_dropcarry", lambda out: build_dropcarry_teacher(args.warm, toy["sft"], out)
        ),
    }
    print(json.dumps({"warm": accuracies(args.warm, task)}), flush=True)
    for route, teacher in teachers.items():
        print(json.dumps({f"teacher_{route}": accuracies(teacher, task)}), flush=True)
    for seed in range(args.seeds):
        for run in args.runs.split(","):
            run_dir = args.out / f"{run}_{args.steps}_{seed}"
            steps = (f"train.steps={args.steps}", f"train.seed={seed}", *args.extra)
            model = distill(args.warm, task, teachers, run, run_dir, *steps)
            print(json.dumps({"run": run, "seed": seed, "after": accuracies(model, task)}), flush=True)


if __name__ == "__main__":
    main()
