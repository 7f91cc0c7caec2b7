"""Reward workers on a CPU-bound reward: the same batch scored with 1 worker and with 2, in one run.

The reward is the `code` built-in (the sandbox) on a program that burns ~0.2 s of CPU per test, so the
time is the reward's, not the service's. Each configuration is warmed up (workers import torch) and
timed `--repeats` times; the median is reported with the ratio. Other load on the CPUs skews the ratio:
the script prints the load average and the busiest processes before it starts, and waits (up to
`--wait-s`) while more than 0.3 of a core is in use.

  .venv/bin/python benchmarks/reward_workers.py [--samples 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

from relayrl.config import RewardConfig
from relayrl.rewards.service import build_reward_service
from relayrl.types import Prompt, Rollout

PROGRAM = "def burn(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n    return total\n"
TESTS = [{"call": "burn(2_000_000)", "expected": sum(i * i for i in range(2_000_000))}]


def busy_cores(seconds: float = 2.0) -> float:
    """Cores in use across the machine right now (from /proc/stat over `seconds`; ps %CPU is a lifetime mean)."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / max(1, total1 - total0))


def top_processes() -> list[str]:
    rows = subprocess.run(
        ["ps", "-eo", "pid=,pcpu=,args=", "--sort=-pcpu"], capture_output=True, text=True
    ).stdout.splitlines()
    return [row.strip()[:100] for row in rows[:3]]


def time_workers(workers: int, samples: int, repeats: int) -> float:
    rollouts = [
        Rollout(Prompt("burn", "", [1], {"tests": TESTS}), i, [1], PROGRAM, [0.0], "stop", [0]) for i in range(samples)
    ]
    config = RewardConfig(
        fn="code", kwargs={"timeout_s": 10.0, "cpu_s": 10}, workers=workers, timeout_s=30.0, batch_size=1
    )
    with build_reward_service(config) as service:
        service.score(rollouts[:workers])  # start-up and first sandbox
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            scores, _ = service.score(rollouts)
            times.append(time.perf_counter() - start)
            assert all(s.reward == 1.0 for s in scores), "the CPU-bound program should pass its test"
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wait-s", type=float, default=600.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.wait_s
    while (busy := busy_cores()) > 0.3 and time.monotonic() < deadline:
        print(f"waiting: {busy:.2f} cores busy; top: {top_processes()}", flush=True)
        time.sleep(30)
    print(f"cores: {os.cpu_count()}  busy before: {busy:.2f} cores  load average: {os.getloadavg()}")
    one = time_workers(1, args.samples, args.repeats)
    two = time_workers(2, args.samples, args.repeats)
    print(
        f"{args.samples} samples, median of {args.repeats}: 1 worker {one:.2f} s, 2 workers {two:.2f} s, "
        f"speed-up {one / two:.2f}x  (busy after: {busy_cores():.2f} cores)"
    )


if __name__ == "__main__":
    main()
