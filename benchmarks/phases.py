"""How close each phase of a local demo step is to this machine's limits, measured in one run (issue 8).

Trains the demo config locally (vLLM engine and learner in one process, both cores) and prints, from the
median of its steps: each phase's time; the update's achieved FLOP/s against the fp32 matmul peak measured
in the same run (model FLOPs utilisation: 3 forward passes' worth of FLOPs, forward + backward, over
every padded position, FLOPs per token from the planner's `forward_flops_per_token`); the share of padded
positions; and the controller's overhead: `time/step` minus the sum of the phases (per step, then the
median).

`step_analysis` (phase medians, MFU, controller overhead of any run's metrics.jsonl rows) and `measure_peak`
are also used by suite.py for peer_trl.py's regime b run.

Usage: python benchmarks/phases.py [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_trl import build_config, cpu_busy, prepare_inputs, run_logged  # noqa: E402

PHASES = ("generate", "reward", "logprobs", "advantage", "update", "sync")
WARMUP_STEPS = 2  # steps dropped before the medians


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def medians(rows: list[dict]) -> dict[str, float]:
    keys = ["time/step", "learner/positions", "learner/padding_frac"] + [f"time/{p}" for p in PHASES]
    return {k: statistics.median(r[k] for r in rows) for k in keys if all(k in r for r in rows)}


def update_flops(model_dir: str | Path, positions: float, sequences: int) -> float:
    """FLOPs of one update over `positions` padded positions of `sequences` rows: forward + backward = 3
    forwards, FLOPs per token from the planner at the mean attention context (half the padded row)."""
    from relayrl.models.shape import load_shape
    from relayrl.planner.timing import forward_flops_per_token

    context = positions / sequences / 2
    return 3 * forward_flops_per_token(load_shape(str(model_dir)), context) * positions


def controller_overhead(rows: list[dict]) -> float:
    """Median over steps of `time/step` minus the sum of the phases, in seconds."""
    return statistics.median(r["time/step"] - sum(r.get(f"time/{p}", 0.0) for p in PHASES) for r in rows)


def step_analysis(rows: list[dict], model_dir: str | Path, sequences: int, peak: float) -> dict:
    """Phase medians, the update's FLOP/s and MFU against `peak`, and the controller overhead of a run's
    steps (warm-up steps already dropped)."""
    median = medians(rows)
    flops = update_flops(model_dir, median["learner/positions"], sequences)
    achieved = flops / median["time/update"]
    overhead = controller_overhead(rows)
    return {
        "median": median,
        "update_flops": flops,
        "achieved_flops": achieved,
        "mfu": achieved / peak,
        "overhead_s": overhead,
        "overhead_frac": overhead / median["time/step"],
        "steps": len(rows),
    }


def measure_peak(sizes: tuple[int, ...] = (1024, 2048), repeats: int = 5) -> float:
    """This machine's fp32 matmul FLOP/s, measured now: the best n x n matmul over `sizes`, best of `repeats`
    each, after the planner's warm-up. (The planner's own `measure_cpu`, one 1024^3 size best of 3, read
    103-158 GFLOP/s on an idle machine where 2048^3 runs at ~180: too low a peak inflates the MFU.)"""
    import torch

    from relayrl.planner.hardware import best_time, warm_up

    warm_up()
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        best = max(best, 2 * n**3 / best_time(lambda a=a, b=b: a @ b, repeats))
    return best


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help=f"at least {WARMUP_STEPS + 1}")
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--dir", default="runs/bench/phases")
    parser.add_argument("--warmstart", default=None)
    args = parser.parse_args(argv)
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps must exceed the {WARMUP_STEPS} warm-up steps")

    busy = cpu_busy()
    peak = measure_peak()
    paths = prepare_inputs(args)
    run_dir = Path(args.dir) / "run"
    _, command = build_config(args, paths, run_dir)
    run_logged(command + ["log.save_model=false"], run_dir / "train.log")
    rows = read_metrics(run_dir)[WARMUP_STEPS:]
    result = step_analysis(rows, paths["init"], args.prompts_per_step * args.n, peak)
    median = result["median"]
    print(f"demo, local, {len(rows)} steps after {WARMUP_STEPS} warm-up steps; CPUs busy before start: {busy:.0%}")
    print(
        "phase medians (s): "
        + "  ".join(f"{p} {median[f'time/{p}']:.3f}" for p in PHASES)
        + f"  step {median['time/step']:.3f}"
    )
    print(
        f"update: {result['update_flops'] / 1e9:.2f} GFLOP per step, {result['achieved_flops'] / 1e9:.1f} GFLOP/s = "
        f"{result['mfu']:.0%} of the fp32 matmul peak measured now ({peak / 1e9:.1f} GFLOP/s)"
    )
    print(f"padded positions: {median['learner/padding_frac']:.0%} of {median['learner/positions']:.0f}")
    print(f"controller overhead: {result['overhead_s'] * 1e3:.1f} ms = {result['overhead_frac']:.1%} of the step")
    return {**result, "peak_flops": peak, "cpu_busy_before_start": busy}


if __name__ == "__main__":
    main()
