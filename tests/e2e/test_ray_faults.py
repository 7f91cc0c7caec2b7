"""A Ray run whose driver is SIGKILLed leaves nothing behind: no shared-memory segment named after it, and no
process of its Ray session (the raylet's agents used to outlive it as orphans for a minute or more).

The run's processes are found by the Ray temp dir the test gives it (RAY_TMPDIR, inherited by every process
of the session), never by a name pattern: other people's Ray clusters run on this machine."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks.learning_cases import write_config

pytestmark = pytest.mark.slow


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def orphaned_segments() -> set[str]:
    """relayrl segments in /dev/shm (either naming) none of whose pids is alive."""
    names = set()
    for path in Path("/dev/shm").glob("relayrl*"):
        pids = [int(part) for part in path.name.replace("-", "_").split("_")[1:3] if part.isdigit()]
        if pids and not any(Path(f"/proc/{pid}").exists() for pid in pids):
            names.add(path.name)
    return names


def first_metrics_row(run_dir: Path, driver: subprocess.Popen, deadline_s: float) -> dict:
    deadline = time.monotonic() + deadline_s
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        assert driver.poll() is None, "the run ended before its first step"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if lines:
            return json.loads(lines[0])
        time.sleep(0.5)
    raise AssertionError(f"no metrics row within {deadline_s} s")


def test_a_killed_driver_leaves_no_segment_and_no_process(tmp_path, random_model_dir, toy_task):
    ray_tmp = tempfile.mkdtemp(prefix="rf", dir="/tmp")  # short: Ray's socket paths live under it
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "cfg.yaml", random_model_dir, toy_task, run_dir, "vllm")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": ray_tmp}
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "relayrl.cli",
            "train",
            str(config),
            "placement.mode=ray",
            "log.progress=false",
            "train.steps=50",
            "rollout.prompts_per_step=8",
            "eval.max_prompts=16",
            "log.save_model=false",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    marker = f"RAY_TMPDIR={ray_tmp}"
    orphans_before = orphaned_segments()
    try:
        first_metrics_row(run_dir, driver, 600)
        assert len(processes_with(marker)) > 2  # the session is up: head processes, agents, actors
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert not list(Path("/dev/shm").glob(f"relayrl_{driver.pid}_*"))
        time.sleep(5)  # the learner actor dies with its owner
        assert not orphaned_segments() - orphans_before
        deadline, left = time.monotonic() + 45, processes_with(marker)
        while left and time.monotonic() < deadline:
            time.sleep(1)
            left = processes_with(marker)
        names = [
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:80]
            for pid in left
            if Path(f"/proc/{pid}").exists()
        ]
        assert not left, f"processes of the killed run's Ray session still alive: {names}"
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in processes_with(marker):  # only this run's processes
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
