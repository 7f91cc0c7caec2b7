"""When the driver of a Ray run dies, however it dies (SIGKILL included), end the Ray session it started.

The run's head (GCS, raylet, their agents, every worker) runs in a session of its own (`ray_head.py`), so that a
signal to the driver's process group does not reach it; nothing ties it to the driver's life. So the driver
starts this watcher, in a session of its own too, holding the write end of a pipe to it. When the pipe closes
(the driver exited or was killed: the kernel closes it either way), the watcher kills every process of the
head's session, and every process whose environment names the run's raylet (`RAY_RAYLET_PID`: its agents and
workers, should one ever leave the session), then sweeps the shared-memory segments of dead processes. It knows
nothing of other people's clusters: only this run's processes are in its session or carry its raylet's pid.

A watcher can die with its driver (`pkill -9 -f relayrl`, an OOM kill of both), so the head's session has a
guard of its own as well: `ray start` runs under it (`start_guarded`), and it holds the read end of a second
pipe from the driver and reaps its own session when that pipe closes. Ending the head now takes the driver, the
watcher and a process of the head's own session killed together, and killing that session ends the head anyway.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

_watchers: list[subprocess.Popen] = []  # referenced for the driver's lifetime: closing the pipe ends the run
EXIT_MARK = "relayrl-guard: the command exited"  # the guard's last line to the driver, before the status


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


def raylet_of(session: int) -> int | None:
    for pid in session_processes(session):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() == "raylet":
                    return pid
        except OSError:
            continue
    return None


def start_guarded(
    command: list[str], timeout_s: float, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str, int | None]:
    """Run `command` (`ray start --head ...`) in a new session under a guard: (the guard, the command's output, its
    exit status; None when it did not finish within `timeout_s` or the guard died first). When the status is 0 the
    guard stays, the session's leader, until the driver closes its stdin (or dies); the caller keeps it. `env`: set
    for the command (and what it starts) over this process's environment."""
    guard = subprocess.Popen(
        [sys.executable, "-m", "relayrl.placement.reaper", "guard", *command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    assert guard.stdout is not None
    chunks, deadline = [], time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0 and select.select([guard.stdout], [], [], left)[0]:
        chunk = os.read(guard.stdout.fileno(), 65536)
        if not chunk:  # the guard closed its stdout: the command has exited
            break
        chunks.append(chunk)
    output = b"".join(chunks).decode(errors="replace")
    head, mark, status = output.rpartition(EXIT_MARK)
    if mark and status.strip().lstrip("-").isdigit():
        return guard, head.rstrip(), int(status)
    return guard, output, None


def _guard(command: list[str]) -> int:
    """The guard's side: run the command with this process's stdout (the driver reads it to its end), then, if it
    succeeded, wait for the driver's pipe to close and reap this session (the daemons it left here)."""
    started = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sys.stdout.buffer.write(started.stdout + f"\n{EXIT_MARK} {started.returncode}\n".encode())
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the pipe's last write end: the driver's read returns
    if started.returncode != 0:
        return started.returncode
    session = os.getsid(0)
    raylet_pid = raylet_of(session)
    sys.stdin.buffer.read()  # returns at end of file: the driver has stopped the head, or is gone
    reap(session, raylet_pid or 0)
    return 0


def reap(session: int, raylet_pid: int) -> None:
    from relayrl.sync.segments import sweep_segments

    doomed = set(session_processes(session)) if session else set()
    doomed |= set(raylet_processes(raylet_pid)) if raylet_pid else set()
    doomed.discard(os.getpid())  # the guard reaps its own session: itself last, by returning
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    sweep_segments()


def main() -> None:
    if sys.argv[1] == "guard":
        sys.exit(_guard(sys.argv[2:]))
    session, raylet_pid = int(sys.argv[1]), int(sys.argv[2])
    sys.stdin.buffer.read()  # returns at end of file: the driver is gone
    reap(session, raylet_pid)


if __name__ == "__main__":
    main()
