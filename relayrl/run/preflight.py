"""Preflight: what would end a GPU run in its first minutes, found before anything starts, each with one message.

- the NVIDIA driver too old for the CUDA the GPU lock's torch is built for (`nvidia-smi`'s header against the
  lock's `nvidia-cuda-runtime` pin): `make setup` runs this file before it installs requirements/gpu.lock, since
  below the floor `torch.cuda.is_available()` is False and every `auto` would silently take the CPU path;
- /dev/shm with less room than a push's buckets when the transport is shm (Docker's default is 64 MB: the first
  pack would die of SIGBUS), checked where the segments are made (relayrl/sync/transports.py);
- the driver's NCCL_*, GLOO_* and *_SOCKET_IFNAME variables, handed to every role actor (relayrl/placement/cluster.py):
  on a multi-NIC cluster a remote node's actors would otherwise pick their own interface;
- model.path and log.dir missing on a node that runs a role (relayrl/placement/node_paths.py).
Standard library only: `make setup` runs it with whichever Python it found, before any package is installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# The oldest Linux driver of each CUDA major version's toolkit (NVIDIA's CUDA Toolkit release notes, table 3): a
# newer runtime of the same major version runs on it (minor version compatibility).
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
FORWARDED = re.compile(r"NCCL_\w+|GLOO_\w+|\w+_SOCKET_IFNAME")


def lock_cuda(lock_text: str) -> tuple[int, int] | None:
    """The CUDA (major, minor) a lock's torch is built for, from its `nvidia-cuda-runtime` pin; None: no CUDA."""
    found = re.search(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)", lock_text, re.MULTILINE)
    return (int(found[1]), int(found[2])) if found else None


def driver_of(smi_text: str) -> tuple[str, tuple[int, int]] | None:
    """(driver version, the newest CUDA it runs) from `nvidia-smi`'s header; None when it shows neither."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", smi_text)
    cuda = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", smi_text)
    return (driver[1], (int(cuda[1]), int(cuda[2]))) if driver and cuda else None


def driver_problem(smi_text: str, lock_text: str, lock_name: str) -> str | None:
    """Why this machine's driver cannot run the lock's torch, or None."""
    needed, found = lock_cuda(lock_text), driver_of(smi_text)
    if needed is None or found is None or found[1][0] >= needed[0]:
        return None
    driver, (major, minor) = found
    floor = MIN_DRIVER.get(needed[0], "a newer one")
    return (
        f"{lock_name} holds a torch built for CUDA {needed[0]}.{needed[1]}, which needs an NVIDIA driver >= {floor}; "
        f"this machine's driver {driver} runs CUDA up to {major}.{minor} (nvidia-smi), so torch would see no GPU "
        f"and every run would take the CPU path. Update the driver, or set up the CPU lock "
        "(make setup LOCK=requirements/cpu.lock)"
    )


def shm_problem(nbytes: int, buckets: int, directory: Path = Path("/dev/shm")) -> str | None:
    """Why `buckets` shared-memory segments of `nbytes` in all do not fit in `directory`, or None."""
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    if nbytes <= free:
        return None
    return (
        f"sync.transport=shm: a push's {buckets} bucket(s) need {_size(nbytes)} in {directory}, which has "
        f"{_size(free)} free on this node (Docker gives a container 64 MiB): start the container with "
        f"--shm-size={max(1, -(-2 * nbytes // 2**30))}g (or --ipc=host), or set sync.transport=broadcast"
    )


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` that choose the network of NCCL and gloo: every role actor gets them."""
    return {name: value for name, value in environ.items() if FORWARDED.fullmatch(name)}


def check_driver(lock: str) -> int:
    """`make setup`'s check before it installs `lock`: 0, or 1 with the message on stderr."""
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0  # no driver to ask: the lock is a user's explicit choice (LOCK=...)
    problem = driver_problem(smi, Path(lock).read_text(), lock)
    if problem:
        print(f"make setup: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # python relayrl/run/preflight.py driver requirements/gpu.lock
    if len(sys.argv) != 3 or sys.argv[1] != "driver":
        sys.exit("usage: python relayrl/run/preflight.py driver LOCK")
    sys.exit(check_driver(sys.argv[2]))
