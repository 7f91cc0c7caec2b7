"""SIGTERM to the whole process group of a Ray run (Slurm's scancel, `kill -TERM -PGID`) stops it like a SIGTERM to
the driver alone: the step finishes, a checkpoint is written, the last line gives the resume command, exit 143,
and nothing of the run's Ray session is left. Resuming it to its end leaves nothing either. A multi-turn run
(environment workers in the driver's group) stops the same way on a group SIGTERM or SIGINT.

The run's processes are found by the Ray temp dir the test gives it (RAY_TMPDIR, inherited by every process
of the session), never by a name pattern: other people's Ray clusters run on this machine."""

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks.learning_cases import CASES, write_config
from tests.e2e.test_preemption import session_processes, signal_after_rows
from tests.e2e.test_ray_faults import processes_with
from tests.e2e.test_resume import metric_rows

pytestmark = pytest.mark.slow

SETTINGS = [
    "placement.mode=ray",
    "train.steps=5",
    "checkpoint.every=0",
    "rollout.prompts_per_step=8",
    "eval.max_prompts=16",
    "log.save_model=false",
    "log.progress=false",
]


def left_of_session(marker: str, grace_s: float = 10.0) -> list[str]:
    """The run's processes still alive `grace_s` after the driver exited (its session watcher needs a moment)."""
    deadline, left = time.monotonic() + grace_s, processes_with(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = processes_with(marker)
    names = []
    for pid in left:
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:80].decode())
    return names


def kill_leftovers(marker: str) -> None:
    for pid in processes_with(marker):  # only this run's processes
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_group_sigterm_under_ray_checkpoints_and_prints_the_resume_line(tmp_path, random_model_dir, toy_task):
    ray_tmp = tempfile.mkdtemp(prefix="rg", dir="/tmp")  # short: Ray's socket paths live under it
    marker = f"RAY_TMPDIR={ray_tmp}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": ray_tmp}
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "cfg.yaml", random_model_dir, toy_task, run_dir, "vllm")
    process = subprocess.Popen(
        [sys.executable, "-m", "relayrl.cli", "train", str(config), *SETTINGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )  # its own group, as a batch job's: scancel signals all of it
    try:
        _, err, seconds = signal_after_rows(process, run_dir, 2, signal.SIGTERM, to_group=True)
        assert process.returncode == 128 + signal.SIGTERM, err[-3000:]
        assert seconds < 60 and "Traceback" not in err, err[-3000:]
        print(f"group SIGTERM to exit: {seconds:.1f} s")
        step = len(metric_rows(run_dir)) - 1
        checkpoint = run_dir / "checkpoints" / f"step_{step:06d}"
        assert checkpoint.is_dir()
        command = f"relayrl train {config} {' '.join(SETTINGS)} --resume {run_dir}"
        # the driver's own last line (Ray may still forward an actor's output after it)
        driver_lines = [line for line in err.strip().splitlines() if line.startswith("relayrl: ")]
        assert driver_lines[-1] == (
            f"relayrl: interrupted by SIGTERM at step {step}; checkpoint {checkpoint}; resume with: {command}"
        ), err[-3000:]
        assert left_of_session(marker) == []
        assert not (Path(ray_tmp) / "ray" / "ray_current_cluster").exists()  # the run's cluster is not advertised

        resumed = subprocess.run(
            [sys.executable, "-m", "relayrl.cli", *shlex.split(command)[1:]],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert [row["step"] for row in metric_rows(run_dir)] == list(range(5))
        assert left_of_session(marker) == []  # a run that ends normally leaves nothing either
    finally:
        if process.poll() is None:
            process.kill()
        kill_leftovers(marker)


MULTI_TURN = [  # the multi-turn learning case (HF engine, the `retry` environment), a few steps
    *CASES["multiturn_retry"].overrides,
    "train.steps=6",
    "checkpoint.every=0",
    "eval.max_prompts=16",
    "log.progress=false",
]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_group_signal_stops_a_multi_turn_run_like_a_single_turn_one(tmp_path, warm_model_dir, toy_task, signum):
    """The environment workers get the group's signal too: they ignore it, and the driver stops them once the
    step is saved (they used to die of it, and the pool then wrote to a dead pipe: BrokenPipeError)."""
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "cfg.yaml", warm_model_dir, toy_task, run_dir, CASES["multiturn_retry"].engine)
    process = subprocess.Popen(
        [sys.executable, "-m", "relayrl.cli", "train", str(config), *MULTI_TURN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        _, err, seconds = signal_after_rows(process, run_dir, 1, signum, to_group=True)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signum, err[-3000:]
    assert seconds < 60 and "Traceback" not in err and "env.on_error" not in err, err[-3000:]
    step = len(metric_rows(run_dir)) - 1
    checkpoint = run_dir / "checkpoints" / f"step_{step:06d}"
    assert checkpoint.is_dir() and step < 5
    command = shlex.join(["relayrl", "train", str(config), *MULTI_TURN, "--resume", str(run_dir)])
    ours = [line for line in err.splitlines() if line.startswith("relayrl: ")]
    name = signal.Signals(signum).name
    assert ours[-1] == f"relayrl: interrupted by {name} at step {step}; checkpoint {checkpoint}; resume with: {command}"
    deadline = time.monotonic() + 10  # the environment workers' server leaves with the driver
    while session_processes(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_processes(process.pid) == []
