"""The session watcher (relayrl/placement/reaper.py) and the head's session (ray_head.py) without Ray: when the
driver's pipe closes, the processes of the run's session and those carrying its raylet's pid are killed, and
nothing else is."""

import os
import subprocess
import sys

from relayrl.placement.ray_head import end_session
from relayrl.placement.reaper import raylet_processes, session_processes

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
# a session leader with a child in its session, as `ray start` leaves GCS and raylet behind
SESSION = [
    sys.executable,
    "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(120)']); time.sleep(120)",
]


def wait_for(predicate, timeout_s=30.0):
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.1)
    return predicate()


def test_closing_the_pipe_kills_the_session_and_the_raylets_processes_and_only_them():
    head = subprocess.Popen(SESSION, start_new_session=True)
    ours = subprocess.Popen(SLEEPER, env={**os.environ, "RAY_RAYLET_PID": "999991"})
    theirs = subprocess.Popen(SLEEPER, env={**os.environ, "RAY_RAYLET_PID": "999992"})
    other_session = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        assert raylet_processes(999991) == [ours.pid]
        assert wait_for(lambda: len(session_processes(head.pid)) == 2)  # the leader and its child
        watcher = subprocess.Popen(
            [sys.executable, "-m", "relayrl.placement.reaper", str(head.pid), "999991"], stdin=subprocess.PIPE
        )
        watcher.stdin.close()  # what the kernel does when the driver dies
        watcher.wait(60)
        assert ours.wait(60) == -9 and head.wait(60) == -9
        assert wait_for(lambda: session_processes(head.pid) == [])  # the child too
        assert theirs.poll() is None and other_session.poll() is None
    finally:
        for process in (head, ours, theirs, other_session):
            process.kill()
            process.wait()


def test_ending_a_session_spares_the_callers_and_others():
    head = subprocess.Popen(SESSION, start_new_session=True)
    other_session = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        assert wait_for(lambda: len(session_processes(head.pid)) == 2)
        end_session(head.pid, grace_s=5)
        assert head.wait(10) == -15  # SIGTERM first
        assert session_processes(head.pid) == []
        assert other_session.poll() is None and os.getsid(0) != head.pid
    finally:
        for process in (head, other_session):
            process.kill()
            process.wait()
