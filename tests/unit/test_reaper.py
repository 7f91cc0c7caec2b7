"""The session watcher (relayrl/placement/reaper.py) without Ray: when the driver's pipe closes, processes
carrying the run's raylet pid are killed, and nothing else is."""

import os
import subprocess
import sys

from relayrl.placement.reaper import session_processes

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_closing_the_pipe_kills_the_session_and_only_it():
    ours = subprocess.Popen(SLEEPER, env={**os.environ, "RAY_RAYLET_PID": "999991"})
    theirs = subprocess.Popen(SLEEPER, env={**os.environ, "RAY_RAYLET_PID": "999992"})
    try:
        assert session_processes(999991) == [ours.pid]
        watcher = subprocess.Popen([sys.executable, "-m", "relayrl.placement.reaper", "999991"],
                                   stdin=subprocess.PIPE)
        watcher.stdin.close()  # what the kernel does when the driver dies
        watcher.wait(60)
        assert ours.wait(60) == -9
        assert theirs.poll() is None
    finally:
        for process in (ours, theirs):
            process.kill()
            process.wait()
