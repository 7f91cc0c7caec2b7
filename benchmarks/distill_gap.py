"""On-policy distillation against GRPO on the demo task: the held-out greedy curve of each, from the same warm start,
over seeds, and the share of the student-teacher gap each closes (docs/distillation.md has the figures).

The teacher is the warm start fine-tuned on the correct sums (`build_teacher`: two epochs of SFT, ~40 s on CPU),
so it shares the student's tokenizer and knows the carry the warm start's sloppy data left out. Both runs are the
demo's vLLM run (benchmarks/learning_cases.py `write_config`), evaluated every `--every` steps on 200 prompts, and
the teacher on the same prompts. `--runs grpo` runs one side alone (GRPO longer than distillation, say).

`--env retry` is the multi-turn case instead: the multi-turn e2e's run (learning_cases.py `multiturn_retry`: the
built-in `retry` environment, HF engine, 100 held-out prompts) with the same teacher beside the reward
(`algorithm.distill.coef=1`, GRPO's advantage plus the distillation advantage on the policy's tokens), against
the reward alone; held-out success and the discounted greedy score before and after, and the teacher's.

    python -m benchmarks.distill_gap WARM_START_DIR OUT_DIR --seeds 3 [--steps 20 --every 5 --runs distill,grpo]
    python -m benchmarks.distill_gap WARM_START_DIR OUT_DIR --env retry --seeds 3 [--steps 15]
        [--extra rollout.engine=vllm --extra placement.mode=ray --extra train.schedule=one_step_off ...]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from benchmarks.learning_cases import MULTITURN_RETRY, run_in_process, write_config

DISTILL = ("algorithm.advantage=distill",)
EVAL = ("reward.fn=exact_match", "rollout.max_tokens=6", "eval.max_prompts=200")  # write_config's held-out set
RETRY_ENV = tuple(o for o in MULTITURN_RETRY if o.startswith("env.") and not o.startswith("env.max_inflight"))
RETRY_EVAL = ("rollout.max_tokens=6", *RETRY_ENV, "eval.max_prompts=100")  # the multi-turn run's held-out set


def true_sum(a: int, b: int) -> int:
    return a + b


def build_teacher(warm: str | Path, sft_rows: Path, out: Path, answer: Callable[[int, int], int] = true_sum) -> Path:
    """The warm start after two epochs of SFT on `sft_rows`' prompts with `answer(a, b)` (the true sums) as
    completions."""
    import tempfile

    from relayrl.learner.sft import SFTSettings, run_sft

    rows = [json.loads(line) for line in sft_rows.read_text().splitlines()]
    unique = {row["prompt"]: str(answer(*(int(x) for x in row["prompt"][:-1].split("+")))) for row in rows}
    settings = SFTSettings(epochs=2.0, batch_size=128, lr=1e-3, warmup_steps=5)
    with tempfile.TemporaryDirectory() as scratch:
        clean = Path(scratch) / "true_sums.jsonl"
        clean.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in unique.items()))
        return run_sft(clean, out, model_path=str(warm), settings=settings, log=lambda *_: None)


def curve(run_dir: Path) -> list[tuple[int, float]]:
    """(steps done, held-out greedy accuracy): before, at each eval.every, after."""
    scores = json.loads((run_dir / "eval.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    points = [(0, scores["before"]["greedy"])]
    points += [(row["step"] + 1, row["eval/greedy"]) for row in rows if "eval/greedy" in row]
    return [*points, (len(rows), scores["after"]["greedy"])]


def held_out(model: Path, eval_rows: Path, overrides: tuple[str, ...] = EVAL) -> dict:
    """`relayrl eval`'s line for a model on the runs' held-out prompts: reward_mean is its greedy score."""
    result = run_in_process("eval", str(model), str(eval_rows), *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def runs_of(env: str, teacher: Path) -> dict[str, tuple[str, ...]]:
    """Each compared run's overrides, by name: on the demo task distillation alone against GRPO; on `retry` the
    multi-turn e2e's run with the teacher beside the reward against the reward alone."""
    if env == "retry":
        return {
            "grpo_distill": (*MULTITURN_RETRY, f"teacher.path={teacher}", "algorithm.distill.coef=1"),
            "grpo": MULTITURN_RETRY,
        }
    return {"distill": (f"teacher.path={teacher}", *DISTILL), "grpo": ()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("warm")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5, help="eval.every: a point of the curve each this many steps")
    parser.add_argument("--runs", default="", help="comma-separated run names to do (default: all of --env's)")
    parser.add_argument("--env", choices=("", "retry"), default="", help="retry: the multi-turn case")
    parser.add_argument("--extra", action="append", default=[], help="an override for every run (repeatable)")
    args = parser.parse_args()
    from relayrl.data.toy import write_toy_task

    task = write_toy_task(args.out / "toy", seed=0)
    teacher = args.out / "teacher"
    if not (teacher / "config.json").is_file():
        build_teacher(args.warm, task["sft"], teacher)
    print(json.dumps({"teacher": held_out(teacher, task["eval"], RETRY_EVAL if args.env else EVAL)}), flush=True)
    steps = (f"train.steps={args.steps}", f"eval.every={args.every}", "log.save_model=false")
    runs = runs_of(args.env, teacher)
    names = args.runs.split(",") if args.runs else list(runs)
    engine = "hf" if args.env else "vllm"  # the multi-turn e2e's engine
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for name in names:
            run_dir = args.out / f"{name}_{seed}"
            config = write_config(args.out / f"{name}_{seed}.yaml", args.warm, task, run_dir, engine)
            result = run_in_process("train", str(config), *runs[name], *steps, f"train.seed={seed}", *args.extra)
            assert result.returncode == 0, result.stderr[-3000:]
            scores = json.loads((run_dir / "eval.json").read_text())
            print(json.dumps({"run": name, "seed": seed, "curve": curve(run_dir), "eval": scores}), flush=True)


if __name__ == "__main__":
    main()
