"""How close each phase of a local demo step is to this machine's limits, measured in one run (issue 8).

Trains the demo config locally (vLLM engine and learner in one process, both cores) and prints, from the
median of its steps: each phase's time; the update's achieved FLOP/s against the fp32 matmul peak measured
in the same run (model FLOPs utilisation: 3 forward passes' worth of FLOPs, forward + backward, over
every padded position, FLOPs per token from the planner's `forward_flops_per_token`); the share of padded
positions; and the controller's overhead: `time/step` minus the sum of the phases (per step, then the
median).

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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--dir", default="runs/bench/phases")
    parser.add_argument("--warmstart", default=None)
    args = parser.parse_args(argv)
    from relayrl.planner.hardware import PROFILES, measure_cpu
    from relayrl.planner.shape import load_shape
    from relayrl.planner.timing import forward_flops_per_token

    busy = cpu_busy()
    peak = measure_cpu(PROFILES["cpu"]).peak_tflops * 1e12
    paths = prepare_inputs(args)
    run_dir = Path(args.dir) / "run"
    _, command = build_config(args, paths, run_dir)
    run_logged(command + ["log.save_model=false"], run_dir / "train.log")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][2:]
    median = {k: statistics.median(r[k] for r in rows)
              for k in ["time/step", "learner/positions", "learner/padding_frac"] + [f"time/{p}" for p in PHASES]}
    shape = load_shape(str(paths["warmstart"]))
    context = median["learner/positions"] / (args.prompts_per_step * args.n) / 2
    update_flops = 3 * forward_flops_per_token(shape, context) * median["learner/positions"]
    achieved = update_flops / median["time/update"]
    overhead = statistics.median(r["time/step"] - sum(r.get(f"time/{p}", 0.0) for p in PHASES) for r in rows)
    print(f"demo, local, {len(rows)} steps after 2 warm-up steps; CPUs busy before start: {busy:.0%}")
    print("phase medians (s): " + "  ".join(f"{p} {median[f'time/{p}']:.3f}" for p in PHASES)
          + f"  step {median['time/step']:.3f}")
    print(f"update: {update_flops / 1e9:.2f} GFLOP per step, {achieved / 1e9:.1f} GFLOP/s = "
          f"{achieved / peak:.0%} of the fp32 matmul peak measured now ({peak / 1e9:.1f} GFLOP/s)")
    print(f"padded positions: {median['learner/padding_frac']:.0%} of {median['learner/positions']:.0f}")
    print(f"controller overhead: {overhead * 1e3:.1f} ms = {overhead / median['time/step']:.1%} of the step")
    return {"median": median, "mfu": achieved / peak, "overhead_frac": overhead / median["time/step"]}


if __name__ == "__main__":
    main()
