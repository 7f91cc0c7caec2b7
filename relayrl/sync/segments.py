"""The shared-memory segments of the `shm` transport, by name: where they live, how a name says which processes
own it, and the sweep that unlinks those whose processes are gone. Torch-free: the Ray session's watcher
(placement/reaper.py) sweeps after a killed run, and importing torch there cost each Ray run 1.5 s of CPU."""

from __future__ import annotations

import os
import re
from pathlib import Path

SHM_DIR = Path("/dev/shm")
_SEGMENT = re.compile(r"relayrl_(\d+)_(\d+)_[0-9a-f]+-\d+|relayrl-(\d+)-[0-9a-f]+-\d+")  # (and the older naming)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep_segments(directory: Path = SHM_DIR) -> list[str]:
    """Unlink the relayrl segments whose owner or creator process is gone (a run killed before it could clean
    up); the names removed."""
    removed = []
    for path in directory.glob("relayrl[-_]*") if directory.is_dir() else ():
        match = _SEGMENT.fullmatch(path.name)
        if match and not all(pid_alive(int(pid)) for pid in match.groups() if pid):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed
