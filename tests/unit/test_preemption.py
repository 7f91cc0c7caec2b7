"""SIGTERM/SIGINT: during the steps the first signal waits for the step to end, before them it stops at once,
a second signal exits the process at once; the CLI prints one line with the exact resume command."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from relayrl.cli import resume_command
from relayrl.run.preemption import Interrupted, StopSignals


def test_during_the_steps_a_signal_is_recorded_and_the_step_goes_on():
    previous = signal.getsignal(signal.SIGTERM)
    lines = []
    signals = StopSignals(log=lines.append)
    with signals.during_steps():
        os.kill(os.getpid(), signal.SIGTERM)
        finished_step = True  # the handler returned: nothing was interrupted
    assert finished_step and signals.requested == signal.SIGTERM
    assert lines == [
        "relayrl: SIGTERM received: stopping after the current step with a checkpoint (send it again to exit at once)"
    ]
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored after the run


def test_before_the_steps_a_signal_stops_at_once():
    with StopSignals() as signals, pytest.raises(Interrupted) as stop:
        os.kill(os.getpid(), signal.SIGINT)
    assert signals.requested == signal.SIGINT
    assert stop.value.exit_status == 130 and stop.value.describe() == "interrupted by SIGINT before the first step"


def test_a_second_signal_exits_at_once():
    script = textwrap.dedent("""
        import os, signal, time
        from relayrl.run.preemption import StopSignals

        with StopSignals().during_steps():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
        print("not reached")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + signal.SIGTERM and "not reached" not in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "relayrl: second signal (SIGTERM): exiting now, without a checkpoint"
    )


def test_the_interrupt_message_names_the_step_and_checkpoint():
    stop = Interrupted(signal.SIGTERM, "runs/x", 3, "runs/x/checkpoints/step_000003")
    assert stop.exit_status == 143
    assert stop.describe() == "interrupted by SIGTERM at step 3; checkpoint runs/x/checkpoints/step_000003"


def test_the_resume_command_repeats_the_users_train_line():
    args = SimpleNamespace(command="train", config="my cfg.yaml", overrides=["train.lr=1e-5", "log.dir=runs/x"])
    assert resume_command(args, "runs/x") == "relayrl train 'my cfg.yaml' train.lr=1e-5 log.dir=runs/x --resume runs/x"
    demo = SimpleNamespace(command="demo", dir="runs/demo", overrides=[])
    assert resume_command(demo, "runs/demo") == "relayrl train runs/demo/config.yaml --resume runs/demo"


def _start_run(tmp_path, model_dir, toy_task, *extra):
    """`relayrl train` (HF engine, tiny random model) in its own session, as a terminal's foreground job."""
    import yaml

    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(model_dir)},
                "data": {"train": str(toy_task["train"]), "max_prompt_tokens": 16},
                "rollout": {"engine": "hf", "n": 2, "prompts_per_step": 4, "max_tokens": 4},
                "train": {"steps": 200},
                "checkpoint": {"every": 50},
                "log": {"dir": str(tmp_path / "run"), "progress": False, "save_model": False},
            }
        )
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "relayrl.cli", "train", str(config), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return config, process


def _signal_after_rows(process, run_dir, rows, signum, to_group=False):
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= rows):
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.05)
    (os.killpg if to_group else os.kill)(process.pid, signum)
    return process.communicate(timeout=300)


def _alive_in_session(sid):
    """Live (not zombie) processes left in the run's session: engines, reward workers."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and os.getsid(int(pid)) == sid:
                alive.append(int(pid))
        except (OSError, IndexError):
            pass
    return alive


def test_sigterm_writes_a_checkpoint_after_the_step_and_prints_the_resume_command(tmp_path, random_model_dir, toy_task):
    config, process = _start_run(tmp_path, random_model_dir, toy_task, "train.seed=3")
    _, err = _signal_after_rows(process, tmp_path / "run", 2, signal.SIGTERM)
    assert process.returncode == 143 and "Traceback" not in err, err[-3000:]
    step = len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) - 1
    checkpoint = tmp_path / "run" / "checkpoints" / f"step_{step:06d}"
    assert checkpoint.is_dir()
    assert err.strip().splitlines()[-1] == (
        f"relayrl: interrupted by SIGTERM at step {step}; checkpoint {checkpoint}; "
        f"resume with: relayrl train {config} train.seed=3 --resume {tmp_path / 'run'}"
    )


def test_ctrl_c_with_reward_workers_stops_every_worker_without_a_traceback(tmp_path, random_model_dir, toy_task):
    _, process = _start_run(tmp_path, random_model_dir, toy_task, "reward.workers=1")
    _, err = _signal_after_rows(process, tmp_path / "run", 2, signal.SIGINT, to_group=True)  # what Ctrl-C does
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("relayrl: interrupted by SIGINT at step ")
    for _ in range(100):  # a worker (or multiprocessing's resource tracker) may take a moment to exit
        if not _alive_in_session(process.pid):
            break
        time.sleep(0.1)
    assert _alive_in_session(process.pid) == []
