"""When the driver of a Ray run dies, however it dies (SIGKILL included), end what its Ray session left behind.

Ray ties the head processes it starts (GCS, raylet, monitors) to the driver: the kernel kills them with it.
The raylet's agents (DashboardAgent, RuntimeEnvAgent) are not: measured here (Ray 2.60), after a SIGKILLed
driver they live on for 60-100 s as orphans, blocked reporting the raylet's death to the dead GCS; no
`ray.init` option changes that. So the driver starts this watcher, holding the write end of a pipe to it.
When the pipe closes (the driver exited or was killed: the kernel closes it either way), the watcher kills
every process whose environment names the run's raylet (`RAY_RAYLET_PID`: its agents and any worker left)
and sweeps the shared-memory segments of dead processes. It knows nothing of other people's clusters:
only processes started by this run's raylet carry its pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

_watchers: list[subprocess.Popen] = []  # referenced for the driver's lifetime: closing the pipe ends the run


def watch(raylet_pid: int) -> subprocess.Popen:
    """Start the watcher for the Ray session whose raylet is `raylet_pid` (call once Ray is up)."""
    watcher = subprocess.Popen([sys.executable, "-m", "relayrl.placement.reaper", str(raylet_pid)],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # a signal to the driver's process group spares it
    _watchers.append(watcher)
    return watcher


def session_processes(raylet_pid: int) -> list[int]:
    """Processes started by that raylet (they carry RAY_RAYLET_PID=<pid> in their environment)."""
    marker, found = f"RAY_RAYLET_PID={raylet_pid}".encode(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone already, or not ours to read
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def reap(raylet_pid: int) -> None:
    from relayrl.sync.transports import sweep_segments

    for pid in session_processes(raylet_pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sweep_segments()


def main() -> None:
    raylet_pid = int(sys.argv[1])
    sys.stdin.buffer.read()  # returns at end of file: the driver is gone
    reap(raylet_pid)


if __name__ == "__main__":
    main()
