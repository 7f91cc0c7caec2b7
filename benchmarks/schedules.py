"""Schedules benchmark: the same task and sample budget under `sync`, `one_step_off` and `async`, one run.

Every schedule trains the demo task (warm-started tiny Llama, two-number addition) for the same number of
steps of the same batch, under `placement.mode=ray` with disaggregated roles: the learner on one core,
one vLLM engine on the other. Every schedule uses the same rollout correction (`tis_token`), so the only
difference is what overlaps. Printed per schedule: samples/s (rollout batch / median step time) and its
ratio to `sync`, the median of each phase, mean version lag, and held-out greedy accuracy after the same
number of samples (the run's own evaluation on the 500 held-out problems). The JSON goes to --out.

Usage: python benchmarks/schedules.py [--steps 30] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_trl import build_config, cpu_busy, cpu_sample, others_share, prepare_inputs, run_logged  # noqa: E402

SCHEDULES = {
    "sync": [],
    "one_step_off": ["train.schedule=one_step_off"],
    "async": ["train.schedule=async", "train.max_staleness=1", "train.on_stale=wait"],
}
COMMON = [
    "placement.mode=ray",
    "placement.layout=disaggregated",
    "placement.learner_cpus=1",
    "placement.engine_cpus=1",
    "algorithm.correction.mode=tis_token",
    "log.save_model=false",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--dir", default="runs/bench/schedules")
    parser.add_argument("--warmstart", default=None)
    parser.add_argument("--out", default="runs/bench/schedules.json")
    parser.add_argument("--quick", action="store_true", help="6 steps: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = 6
    return args


def run_schedule(args, paths, name: str) -> dict:
    run_dir = Path(args.dir) / name
    _, command = build_config(args, paths, run_dir)
    command += COMMON + SCHEDULES[name]
    start = time.perf_counter()
    run_logged(command, run_dir / "train.log")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = rows[2:] or rows  # the first steps include start-up (compilation of the loss, first pushes)
    step_s = statistics.median(r["time/step"] for r in steady)
    batch = args.prompts_per_step * args.n
    phases = sorted({k for r in steady for k in r if k.startswith("time/") and k != "time/step"})
    scores = json.loads((run_dir / "eval.json").read_text())
    return {
        "median_step_s": step_s,
        "samples_per_s": batch / step_s,
        "wall_s": time.perf_counter() - start,
        "phases": {k[5:]: statistics.median(r.get(k, 0.0) for r in steady) for k in phases},
        "version_lag_mean": statistics.mean(r.get("stale/version_mean", 0.0) for r in rows),
        "greedy_before": scores["before"]["greedy"],
        "greedy_after": scores["after"]["greedy"],
        "samples": batch * len(rows),
    }


def table(results: dict) -> str:
    base = results["sync"]["samples_per_s"]
    phases = sorted({p for r in results.values() for p in r["phases"]})
    head = f"{'schedule':<13} {'samples/s':>9} {'vs sync':>7} {'lag':>4} {'greedy':>13} " + " ".join(
        f"{p:>9}" for p in phases
    )
    lines = [head]
    for name, r in results.items():
        lines.append(
            f"{name:<13} {r['samples_per_s']:>9.0f} {r['samples_per_s'] / base:>6.2f}x "
            f"{r['version_lag_mean']:>4.2f} {r['greedy_before']:>5.3f}->{r['greedy_after']:.3f} "
            + " ".join(f"{r['phases'].get(p, 0.0):>9.3f}" for p in phases)
        )
    return "\n".join(lines) + "\n(phase columns: median seconds per step; `wait` = learner idle for rollouts)"


def main(argv=None) -> dict:
    args = parse_args(argv)
    busy = cpu_busy()
    if busy > 0.1:
        print(f"warning: the CPUs are {busy:.0%} busy before the benchmark starts; timings will be disturbed")
    paths = prepare_inputs(args)
    first = cpu_sample()
    results = {}
    for name in SCHEDULES:
        print(f"running {name} ...", flush=True)
        results[name] = run_schedule(args, paths, name)
    others = others_share(first, cpu_sample())
    print(table(results))
    print(f"same budget: {results['sync']['samples']} samples each; other processes used {others:.0%} of the CPUs")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {"results": results, "cpu_busy_before": busy, "cpu_share_of_other_processes": others, "steps": args.steps},
            indent=2,
        )
    )
    return results


if __name__ == "__main__":
    main()
