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


def test_gcs_deaf_to_sigterm_is_killed_once_only_it_is_left_and_a_worker_gets_its_grace(tmp_path):
    """GCS and the raylet linger 10 s+ on a SIGTERM: once only they are left they get the SIGKILL at once, not after
    the grace; any other process that ignores the SIGTERM (a worker) still gets the whole grace. Stand-ins: Python
    under the names the kernel shows (a process's name is its executable's file name)."""
    import time

    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(120)"
    ended = {}
    for name, grace_s in (("gcs_server", 5.0), ("worker", 1.5)):
        (tmp_path / name).symlink_to(sys.executable)
        process = subprocess.Popen([tmp_path / name, "-c", deaf], start_new_session=True, stdout=subprocess.PIPE)
        try:
            assert process.stdout is not None and process.stdout.readline() == b"\n"  # its SIGTERM is ignored now
            start = time.monotonic()
            end_session(process.pid, grace_s)
            ended[name] = time.monotonic() - start
            assert process.wait(10) == -9 and session_processes(process.pid) == []
        finally:
            process.kill()
            process.wait()
    assert ended["gcs_server"] < 2.5  # not the 5 s grace
    assert ended["worker"] >= 1.5  # the grace, then SIGKILL


# a stand-in for `ray start --head`: leaves a daemon in its session (output closed, as Ray's are) and exits 0
FAKE_RAY_START = [
    sys.executable,
    "-c",
    "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print('head started')",
]
# a driver that starts the guard, says its pid, and waits to be killed (it starts no watcher)
DRIVER = (
    "import sys, time; from relayrl.placement.reaper import start_guarded; "
    f"guard, output, status = start_guarded({FAKE_RAY_START!r}, 60); "
    "print(guard.pid, status, output.strip(), flush=True); time.sleep(120)"
)


def test_the_guard_ends_the_head_when_the_driver_dies_without_its_watcher():
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        guard_pid, status, said = driver.stdout.readline().strip().split(maxsplit=2)
        assert status == "0" and said == "head started"
        session = int(guard_pid)
        assert wait_for(lambda: len(session_processes(session)) == 2)  # the guard and the daemon
        driver.kill()  # SIGKILL: no exit handler runs, no watcher was started
        driver.wait()
        assert wait_for(lambda: session_processes(session) == [])
    finally:
        driver.kill()
        driver.wait()


def test_a_failed_start_passes_its_output_and_status_and_leaves_nothing():
    from relayrl.placement.reaper import start_guarded

    guard, output, status = start_guarded([sys.executable, "-c", "print('port taken'); raise SystemExit(3)"], 60)
    assert (output.strip(), status) == ("port taken", 3)
    assert guard.wait(30) == 3 and session_processes(guard.pid) == []
