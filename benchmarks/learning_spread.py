"""How much each end-to-end learning run gains, over several seeds: the spread the e2e thresholds are set from.

Runs every case of `benchmarks/learning_cases.py` through the CLI, exactly as its test does (same warm start,
toy task and config), with `train.seed=0..N-1`, and prints per case the gains, min / mean / max, the
threshold the test asserts, and whether that threshold is at most half the smallest gain.

    python benchmarks/learning_spread.py --seeds 5 [--cases grpo_vllm,ray_shm] [--out runs/spread.jsonl]

Rows are appended to `--out` as each run finishes, so an interrupted measurement keeps what it had.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.learning_cases import CASES, gain, run_cli, write_config  # noqa: E402  # noqa: E402


def fixtures(work: Path) -> tuple[dict, Path]:
    """The toy task and the warm start, built as tests/conftest.py builds them."""
    from relayrl.data.toy import write_toy_task
    from relayrl.learner.sft import SFTSettings, run_sft

    task = write_toy_task(work / "toy", seed=0)
    model = run_sft(
        task["sft"],
        work / "warm_model",
        init="tiny",
        settings=SFTSettings(epochs=4.0, batch_size=128),
        log=lambda *_: None,
    )
    return task, Path(model)


def run_case(name: str, seed: int, work: Path, task: dict, model: Path) -> dict:
    case = CASES[name]
    run_dir = work / f"{name}-{seed}"
    config = write_config(work / f"{name}-{seed}.yaml", model, task, run_dir, case.engine)
    result = run_cli("train", str(config), *case.overrides, f"train.seed={seed}")
    if result.returncode != 0:
        return {"case": name, "seed": seed, "error": result.stderr[-800:]}
    scores = json.loads((run_dir / "eval.json").read_text())
    return {
        "case": name,
        "seed": seed,
        "gain": gain(scores),
        "before": scores["before"]["greedy"],
        "after": scores["after"]["greedy"],
    }


def summarize(rows: list[dict]) -> None:
    print(f"{'case':24s} {'gains':40s} {'min':>6s} {'mean':>6s} {'max':>6s} {'test':>6s}  ok")
    for name, case in CASES.items():
        gains = [r["gain"] for r in rows if r["case"] == name and "gain" in r]
        if not gains:
            continue
        low = min(gains)
        print(
            f"{name:24s} {' '.join(f'{g:.3f}' for g in gains):40s} {low:6.3f} {statistics.mean(gains):6.3f} "
            f"{max(gains):6.3f} {case.min_gain:6.3f}  {'yes' if case.min_gain <= low / 2 + 1e-9 else 'NO'}"
        )
    for r in rows:
        if "error" in r:
            print(f"{r['case']} seed {r['seed']} failed: {r['error'][-300:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default="runs/learning_spread.jsonl")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        task, model = fixtures(work)
        for seed in range(args.seeds):  # round-robin: a cut-short measurement still covers every case
            for name in args.cases.split(","):
                row = run_case(name, seed, work, task, model)
                print(json.dumps(row), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                rows.append(row)
    summarize(rows)


if __name__ == "__main__":
    main()
