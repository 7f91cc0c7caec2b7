"""pip resolves the GPU lock as a whole: a dry run against the package index (a minute or two of pip's resolver and
metadata reads), kept out of the unit tier (`make test-fast`). The lock's static checks are tests/unit/test_locks.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.unit.test_locks import GPU, pins


@pytest.mark.slow
def test_pip_resolves_the_gpu_lock_as_a_whole(tmp_path):
    """A dry run of the whole lock (full resolution: every requirement of every pin, CUDA torch's included). HTTP
    range requests read each wheel's metadata (fast-deps), so nothing of the ~4 GB is downloaded (~30 s)."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    command += ["--use-feature=fast-deps", "--report", str(report), "-r", str(GPU)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"pip cannot resolve requirements/gpu.lock:\n{run.stderr[-3000:]}"
    installed = {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert installed == {name: version for name, version in pins(GPU).items()}  # nothing added, nothing moved
