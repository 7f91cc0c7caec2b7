"""When the driver of a Ray run dies, however it dies (SIGKILL included), end the Ray session it started.

The run's head (GCS, raylet, their agents, every worker) runs in a session of its own (`ray_head.py`), so that a
signal to the driver's process group does not reach it; nothing ties it to the driver's life. So the driver
starts this watcher, in a session of its own too, holding the write end of a pipe to it. When the pipe closes
(the driver exited or was killed: the kernel closes it either way), the watcher kills every process of the
head's session, and every process whose environment names the run's raylet (`RAY_RAYLET_PID`: its agents and
workers, should one ever leave the session), then sweeps the shared-memory segments of dead processes. It knows
nothing of other people's clusters: only this run's processes are in its session or carry its raylet's pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

_watchers: list[subprocess.Popen] = []  # referenced for the driver's lifetime: closing the pipe ends the run


def watch(session: int, raylet_pid: int | None) -> subprocess.Popen:
    """Start the watcher for the Ray session `session` whose raylet is `raylet_pid` (call once Ray is up)."""
    watcher = subprocess.Popen(
        [sys.executable, "-m", "relayrl.placement.reaper", str(session), str(raylet_pid or 0)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # a signal to the driver's process group spares it
    _watchers.append(watcher)
    return watcher


def _live_pids():
    """(pid, path) of every process that is not a zombie (a zombie is dead: only its parent's wait is missing)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                yield int(entry.name), entry
        except (OSError, IndexError):  # gone already
            continue


def session_processes(session: int) -> list[int]:
    """Live processes of the session `session` (every process started in it keeps its id unless it calls setsid)."""
    found = []
    for pid, _ in _live_pids():
        try:
            if os.getsid(pid) == session:
                found.append(pid)
        except OSError:
            continue
    return found


def raylet_processes(raylet_pid: int) -> list[int]:
    """Processes started by that raylet (they carry RAY_RAYLET_PID=<pid> in their environment)."""
    marker, found = f"RAY_RAYLET_PID={raylet_pid}".encode(), []
    for pid, entry in _live_pids():
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone already, or not ours to read
            continue
        if marker in environ.split(b"\0"):
            found.append(pid)
    return found


def reap(session: int, raylet_pid: int) -> None:
    from relayrl.sync.transports import sweep_segments

    doomed = set(session_processes(session)) if session else set()
    doomed |= set(raylet_processes(raylet_pid)) if raylet_pid else set()
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    sweep_segments()


def main() -> None:
    session, raylet_pid = int(sys.argv[1]), int(sys.argv[2])
    sys.stdin.buffer.read()  # returns at end of file: the driver is gone
    reap(session, raylet_pid)


if __name__ == "__main__":
    main()
