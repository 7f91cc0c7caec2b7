"""How a sandbox run ends (relayrl/rewards/sandbox.py): the launcher's process group killed, then a wait until nothing
the run started is left: the group's processes gone or zombies (the pid namespace torn down by the kernel), and, as
root, no live process of the run's own uid. Each wait is bounded by TEARDOWN_S, then a RewardError."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from relayrl.errors import RewardError

TEARDOWN_S = 10.0  # the longest a killed sandbox may take to leave no process (far more than it ever needs)


def kill_group(group: int) -> bool:
    """SIGKILL process group `group`; False when no process is left in it."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def wait_group_gone(group: int) -> None:
    """Return once no live process is left in the launcher's group, killing again as it waits.

    The launcher's death does not end the run: its init (pid 1 of the sandbox's pid namespace, in this group,
    reparented on the launcher's death) still has to kill and reap every process of the namespace, which the
    kernel does before init itself exits. So the run is over once init is gone or a zombie. Race-free: a pid is
    not reused while a process group of that number exists. Bounded by TEARDOWN_S (then a RewardError)."""
    deadline = time.monotonic() + TEARDOWN_S
    pause = 0.0005
    while kill_group(group) and not all(state == "Z" for state in _group_states(group)):
        if time.monotonic() > deadline:
            raise RewardError(
                f"code sandbox: its processes were still running {TEARDOWN_S:g} s after the kill (process group "
                f"{group}: states {sorted(_group_states(group))}); the kernel did not tear the sandbox down"
            )
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


def wait_uid_gone(uid: int) -> None:
    """Return once no live process of the run's own uid is left, killing each as it waits. The namespace's teardown
    ends them (`wait_group_gone`); once in 1,400 runs beside a busy machine (3 busy processes on 2 cores) the
    program itself was still listed right after, so the uid, which only this run's processes hold, is looked at
    too. Zombies are left to their reaper. Bounded by TEARDOWN_S (then a RewardError)."""
    deadline = time.monotonic() + TEARDOWN_S
    pause = 0.0005
    while live := [pid for pid, state in _uid_processes(uid) if state != "Z"]:
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RewardError(
                f"code sandbox: processes {live} of the run's uid {uid} were still running {TEARDOWN_S:g} s after "
                "the kill; the kernel did not tear the sandbox down"
            )
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


def _uid_processes(uid: int) -> list[tuple[int, str]]:
    """(pid, state letter) of the processes whose real uid is `uid`, read from /proc/PID/status (not the directory's
    owner: a process that changed its uid is not dumpable, and its /proc entries then belong to root)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                found.append((int(entry.name), fields[b"State"].split()[0].decode()))
        except (OSError, KeyError, ValueError, IndexError):
            continue  # exited while we looked
    return found


def _group_states(group: int) -> list[str]:
    """The state letters (R, S, Z, ...) of the processes in process group `group`, read from /proc."""
    states = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == group:
            states.append(fields[0].decode())
    return states
