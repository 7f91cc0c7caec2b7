"""The Ray head a run starts for itself (no `placement.address`): in a session of its own, ended with the run.

`ray.init()` would start GCS, raylet and their agents as the driver's children, in the driver's process group:
a SIGTERM to the group (Slurm's scancel, `kill -TERM -PGID`) killed them with the driver, which then waited a
minute on the dead GCS and exited 1, without its checkpoint or its resume line. So the head is started with
`ray start --head` in a new session (setsid): GCS, raylet, agents and every worker the raylet spawns stay in that
session, out of reach of a signal to the driver's group, and the driver joins with `ray.init(address=...)`.

The session is this run's alone (its id is the pid of the guard that leads it and runs `ray start`, and the kernel does not reuse
a pid while its session lives), so ending the run ends exactly it: `Head.stop` at the driver's exit (a normal
end, an error or a signal), and the watcher and the session's guard of `reaper.py` when the driver is killed.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from relayrl.errors import PlacementError
from relayrl.placement.reaper import raylet_of, session_processes, start_guarded, watch

LOOPBACK = "127.0.0.1"  # the driver reaches its own head here: on this machine, this run's alone (other nodes join a
# cluster of the user's, `placement.address`, never this one; the head's node IP is Ray's to pick)
START_TIMEOUT_S = 300
# The raylet starts an idle worker per CPU when the first driver connects; relayrl's actors never take them (they
# start their own, with the job's runtime env), so on a 2-core machine 3 idle workers cost 2 s of CPU a run, and a
# 128-core node would start 128 Python processes for nothing.
NO_PRESTART = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
STOP_GRACE_S = 2  # SIGTERM first: workers and agents leave within ~1 s; GCS and raylet linger 10 s+, so SIGKILL


@dataclass
class Head:
    """A Ray head started by this driver: its GCS address, its session id, the watcher that outlives us and the guard
    that leads the session (reaper.py)."""

    address: str
    session: int
    watcher: subprocess.Popen | None = None
    guard: subprocess.Popen | None = None
    stopped: bool = False

    def stop(self) -> None:
        """Disconnect, end every process of the session (SIGTERM, then SIGKILL after STOP_GRACE_S), release the
        watcher. Runs at the driver's exit; safe to call twice."""
        if self.stopped:
            return
        self.stopped = True
        import ray

        ray.shutdown()
        end_session(self.session, STOP_GRACE_S)
        if self.watcher is not None:
            assert self.watcher.stdin is not None  # reaper.watch starts it with stdin=PIPE
            self.watcher.stdin.close()  # what is left (nothing, normally) is the watcher's to end
            with suppress(subprocess.TimeoutExpired):
                self.watcher.wait(STOP_GRACE_S)
        if self.guard is not None:  # ended with its session above; reaped here
            assert self.guard.stdin is not None
            self.guard.stdin.close()
            with suppress(subprocess.TimeoutExpired):
                self.guard.wait(STOP_GRACE_S)


def start_head(num_cpus: int) -> Head:
    """Start the head in its own session and watch it; the caller connects with `ray.init(address=head.address)`."""
    os.environ.update(auth_env())  # for the driver, and for the head, which inherits it
    refresh_ray_auth()
    with address_file_kept():
        for _ in range(3):  # the port is free when picked; another program may take it before GCS binds it
            port = free_port()
            command = [
                sys.executable,
                "-m",
                "ray.scripts.scripts",
                "start",
                "--head",
                f"--port={port}",
                f"--num-cpus={num_cpus}",
                "--include-dashboard=false",
                "--disable-usage-stats",
                "--no-monitor",  # the autoscaler's monitor: a fixed private cluster has nothing to scale
            ]
            guard, output, status = start_guarded(command, START_TIMEOUT_S, NO_PRESTART)
            if status == 0:
                return Head(f"{LOOPBACK}:{port}", guard.pid, watch(guard.pid, raylet_of(guard.pid)), guard)
            end_session(guard.pid, 0)
            if status is None:
                raise PlacementError(f"the Ray head did not start within {START_TIMEOUT_S} s:\n{output[-2000:]}")
    tail = "\n".join(output.strip().splitlines()[-15:])
    raise PlacementError(f"could not start the Ray head (`ray start --head` exited {status}):\n{tail}")


@contextmanager
def address_file_kept():
    """`ray start` records its cluster as the machine's current one (<Ray temp dir>/ray_current_cluster, read by
    `ray.init(address="auto")` and `ray status`); `ray.init()` never did. Put back what was there: this run's
    private cluster is nobody else's to find, nor a dead address for them once it ends."""
    from ray._common.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    previous = path.read_text() if path.is_file() else None
    try:
        yield
    finally:
        try:
            if previous is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(previous)
        except OSError:
            pass


def auth_env() -> dict[str, str]:
    """Token authentication, as `ray.init()` would set up, with a token of this run's own (no file written),
    unless the user chose a mode or a token."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return {}
    if "RAY_AUTH_TOKEN" not in os.environ:
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # the driver's children (the head) inherit it
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.environ["RAY_AUTH_TOKEN"]}


def refresh_ray_auth() -> None:
    """Ray reads RAY_AUTH_MODE and the token once, when it is imported; re-read them, as `ray.init()` does
    when it turns token authentication on (ray/_private/authentication/authentication_token_setup.py)."""
    # compiled; ray's _raylet.pyi stub leaves these two out
    from ray._raylet import AuthenticationTokenLoader, Config  # pyright: ignore[reportAttributeAccessIssue]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def end_session(session: int, grace_s: float) -> None:
    """SIGTERM every process of the session, wait up to `grace_s` for them to leave, SIGKILL the rest. GCS, the
    raylet and at times its agents linger 10 s+ on a SIGTERM (the workers leave within ~0.2 s): once only they are
    left, they get the SIGKILL at once, not after the whole grace (2 s of every run's end)."""
    steps = [(signal.SIGTERM, grace_s)] if grace_s else []
    for signum, wait_s in steps + [(signal.SIGKILL, 5.0)]:
        left = session_processes(session)
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = session_processes(session)
            if signum == signal.SIGTERM and all(_lingers(pid) for pid in left):
                break
        if not left:
            return


LINGERING = ("gcs_server", "raylet", "ray::RuntimeEnv", "ray::DashboardA")  # process names, as the kernel cuts them


def _lingers(pid: int) -> bool:
    """Whether `pid` is Ray's GCS server, raylet or one of its agents (or gone already): none holds a run's state."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() in LINGERING
    except OSError:
        return True
