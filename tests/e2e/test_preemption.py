"""SIGTERM/SIGINT mid-run: the step finishes, a checkpoint is written, every role stops, one line gives the
resume command, and resuming from it gives the same metrics as a run never interrupted (`sync` schedule)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.learning_cases import run_cli, write_config
from tests.e2e.test_resume import assert_same_metrics, metric_rows

pytestmark = pytest.mark.slow

SETTINGS = [  # as the straight_sync_run fixture's (tests/conftest.py), which the resumed run is compared with
    "train.steps=4",
    "checkpoint.every=2",
    "checkpoint.keep=2",
    "eval.max_prompts=16",
    "rollout.prompts_per_step=16",
    "log.save_model=false",
    "log.progress=false",
]


def start(config, *extra):
    """The CLI in its own session, as a terminal's foreground job: a signal can go to the whole group."""
    return subprocess.Popen(
        [sys.executable, "-m", "relayrl.cli", "train", str(config), *SETTINGS, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def signal_after_rows(process, run_dir, rows, signum, to_group=False):
    """Send `signum` once `rows` metrics rows are logged; returns (stdout, stderr, seconds from signal to exit)."""
    deadline = time.time() + 600
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= rows):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    (os.killpg if to_group else os.kill)(process.pid, signum)
    sent = time.time()
    out, err = process.communicate(timeout=120)
    return out, err, time.time() - sent


def session_processes(sid):
    """Live (not zombie) processes left in the CLI's session: engines, actors, reward workers, Ray's daemons."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
            if state != "Z" and os.getsid(int(pid)) == sid:
                alive.append(int(pid))
        except (OSError, IndexError):
            pass
    return alive


def test_sigterm_saves_the_step_and_resumes_to_the_same_metrics(tmp_path, warm_model_dir, toy_task, straight_sync_run):
    straight = straight_sync_run.dir
    assert straight_sync_run.settings == SETTINGS
    stopped = tmp_path / "stopped"
    config = write_config(tmp_path / "b.yaml", warm_model_dir, toy_task, stopped, "vllm")
    process = start(config)
    _, err, seconds = signal_after_rows(process, stopped, 1, signal.SIGTERM)  # during step 1 (or 2)
    assert process.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert seconds < 60 and "Traceback" not in err
    ours = [line for line in err.splitlines() if line.startswith("relayrl: interrupted")]
    step = len(metric_rows(stopped)) - 1
    checkpoint = stopped / "checkpoints" / f"step_{step:06d}"
    assert checkpoint.is_dir() and step < 3
    command = f"relayrl train {config} {' '.join(SETTINGS)} --resume {stopped}"
    assert ours == [f"relayrl: interrupted by SIGTERM at step {step}; checkpoint {checkpoint}; resume with: {command}"]
    assert session_processes(process.pid) == []
    with (stopped / "metrics.jsonl").open("a") as f:
        f.write('{"step": 9, "reward/me')  # a torn last row, as a kill during the write leaves it

    resumed = run_cli(*shlex.split(command)[1:])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in metric_rows(stopped)] == list(range(4))
    assert_same_metrics(metric_rows(straight), metric_rows(stopped))  # mismatch/* to 1e-5: engine float noise
    assert json.loads((stopped / "eval.json").read_text()) == json.loads((straight / "eval.json").read_text())
    timeline = [json.loads(line) for line in (stopped / "timeline.jsonl").read_text().splitlines()]
    updates = [row["step"] for row in timeline if row["phase"] == "update"]
    assert updates == list(range(4))  # the first run's rows kept up to its checkpoint, none twice


def test_ctrl_c_under_ray_stops_with_one_line_and_no_traceback(tmp_path, random_model_dir, toy_task):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", random_model_dir, toy_task, run_dir, "vllm")  # no learning needed
    process = start(config, "placement.mode=ray", "reward.workers=1")
    _, err, seconds = signal_after_rows(process, run_dir, 1, signal.SIGINT, to_group=True)  # Ctrl-C
    assert process.returncode == 128 + signal.SIGINT, err[-3000:]
    assert seconds < 60 and "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    step = len(metric_rows(run_dir)) - 1
    ours = [line for line in err.splitlines() if line.startswith("relayrl: interrupted")]  # Ray relays actor logs too
    assert len(ours) == 1 and ours[0].startswith(f"relayrl: interrupted by SIGINT at step {step}; checkpoint ")
    assert (run_dir / "checkpoints" / f"step_{step:06d}").is_dir()
    deadline = time.time() + 30  # Ray's daemons leave after the driver
    while session_processes(process.pid) and time.time() < deadline:
        time.sleep(0.5)
    assert session_processes(process.pid) == []
