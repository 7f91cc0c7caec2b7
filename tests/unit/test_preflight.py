"""Preflight (relayrl/run/preflight.py, relayrl/placement/node_paths.py): each first-GPU-run failure of the review
refused before anything starts, with one message. The driver from a captured `nvidia-smi` header against the real
GPU lock (and the file `make setup` runs, with a stand-in `nvidia-smi` on PATH); /dev/shm at Docker's 64 MiB under
a real shm sender; the Makefile's Python on a PATH with only python3.12, or none; the driver's NCCL/gloo variables in
every role actor's options; model.path and log.dir missing on a node."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relayrl.errors import SyncError
from relayrl.placement.cluster import Slot, actor_options
from relayrl.placement.node_paths import node_paths_problem, shared_paths
from relayrl.run.preflight import driver_problem, forwarded_env, lock_cuda
from relayrl.sync.buckets import make_layout
from relayrl.sync.transports import SHM_DIR, ShmSender

ROOT = Path(__file__).resolve().parents[2]
GPU_LOCK = ROOT / "requirements" / "gpu.lock"
SMI_HEADER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
"""


def smi(driver: str, cuda: str) -> str:
    return SMI_HEADER.format(driver=driver, cuda=cuda)


def test_the_gpu_lock_needs_cuda_13_and_the_cpu_lock_none():
    assert lock_cuda(GPU_LOCK.read_text()) == (13, 0)
    assert lock_cuda((ROOT / "requirements" / "cpu.lock").read_text()) is None


def test_a_driver_older_than_the_locks_cuda_is_refused_naming_both():
    problem = driver_problem(smi("550.54.15", "12.4"), GPU_LOCK.read_text(), "requirements/gpu.lock")
    assert problem == (
        "requirements/gpu.lock holds a torch built for CUDA 13.0, which needs an NVIDIA driver >= 580.65.06; this "
        "machine's driver 550.54.15 runs CUDA up to 12.4 (nvidia-smi), so torch would see no GPU and every run would "
        "take the CPU path. Update the driver, or set up the CPU lock (make setup LOCK=requirements/cpu.lock)"
    )
    assert driver_problem(smi("580.82.07", "13.0"), GPU_LOCK.read_text(), "gpu.lock") is None
    assert driver_problem(smi("590.10", "13.1"), GPU_LOCK.read_text(), "gpu.lock") is None


def test_make_setups_driver_check_reads_nvidia_smi(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{smi('535.104.05', '12.2')}EOF\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    run = [sys.executable, str(ROOT / "relayrl/run/preflight.py"), "driver", str(GPU_LOCK)]
    done = subprocess.run(run, capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "this machine's driver 535.104.05 runs CUDA up to 12.2" in done.stderr
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{smi('580.82.07', '13.0')}EOF\n")
    assert subprocess.run(run, capture_output=True, text=True, env=env).returncode == 0


def test_a_dev_shm_smaller_than_the_buckets_is_refused_before_a_segment_is_made(monkeypatch):
    layout = make_layout([("model.embed_tokens.weight", (1024, 25_600))], bucket_mb=64, wire_dtype="fp32")  # 100 MiB
    real = os.statvfs(SHM_DIR)
    docker = os.statvfs_result((4096, 4096, 16384, 16384, 16384, *tuple(real)[5:]))  # 64 MiB free
    monkeypatch.setattr(os, "statvfs", lambda path: docker if Path(path) == SHM_DIR else real)
    before = set(SHM_DIR.iterdir())
    with pytest.raises(SyncError) as refused:
        ShmSender(layout)
    assert str(refused.value) == (
        "sync.transport=shm: a push's 1 bucket(s) need 100.0 MiB in /dev/shm, which has 64.0 MiB free on this node "
        "(Docker gives a container 64 MiB): start the container with --shm-size=1g (or --ipc=host), or set "
        "sync.transport=broadcast"
    )
    assert set(SHM_DIR.iterdir()) == before


def test_the_drivers_network_variables_reach_every_role_actor(monkeypatch):
    for name, value in {
        "NCCL_SOCKET_IFNAME": "eth1",
        "NCCL_IB_HCA": "mlx5_0",
        "GLOO_SOCKET_IFNAME": "eth1",
        "TP_SOCKET_IFNAME": "eth1",
        "MY_SECRET": "x",
    }.items():
        monkeypatch.setenv(name, value)
    env = actor_options(None, Slot("engine 0", 0, 1.0, 1, "0"))["runtime_env"]["env_vars"]
    assert {k: env[k] for k in forwarded_env(os.environ)} == {
        "NCCL_SOCKET_IFNAME": "eth1",
        "NCCL_IB_HCA": "mlx5_0",
        "GLOO_SOCKET_IFNAME": "eth1",
        "TP_SOCKET_IFNAME": "eth1",
    }
    assert "MY_SECRET" not in env and env["OMP_NUM_THREADS"] == "1"


def test_a_path_a_node_lacks_is_refused_naming_the_node_and_its_roles(tmp_path):
    paths = shared_paths(str(tmp_path), str(tmp_path / "not-made-yet"))
    assert paths == {"model.path": str(tmp_path)}  # only what the driver has is asked about
    nodes = {0: "node aaaaaaaaaaaa (10.0.0.1)", 1: "node bbbbbbbbbbbb (10.0.0.2)"}
    roles = {0: ["learner"], 1: ["engine 0"]}
    missing = {nodes[0]: [], nodes[1]: ["model.path"]}
    assert node_paths_problem(missing, paths, roles, nodes) == (
        f"model.path {tmp_path}: not a directory on node bbbbbbbbbbbb (10.0.0.2), where engine 0 run(s), though this "
        "driver has it. Every node that runs a role reads model.path and writes checkpoints into log.dir: put them "
        "on a file system every node mounts (or the same path on each node)"
    )
    assert node_paths_problem({nodes[0]: [], nodes[1]: []}, paths, roles, nodes) is None


MAKE = shutil.which("make")


@pytest.mark.skipif(MAKE is None, reason="no make on this machine")
def test_make_setup_takes_any_python_3_11_to_3_13_on_path(tmp_path):
    only_312 = tmp_path / "bin"
    only_312.mkdir()
    (only_312 / "python3.12").symlink_to(sys.executable)  # this venv's Python stands in for a 3.12 (-n runs nothing)
    venv = tmp_path / "venv"
    dry = subprocess.run(
        [MAKE, "-n", "setup", f"VENV={venv}"], cwd=ROOT, env={"PATH": str(only_312)}, capture_output=True, text=True
    )
    assert f"{only_312 / 'python3.12'} -m venv {venv}" in dry.stdout, dry.stdout + dry.stderr
    none = subprocess.run(
        [MAKE, "setup", f"VENV={venv}"], cwd=ROOT, env={"PATH": str(tmp_path / "empty")}, capture_output=True, text=True
    )
    assert none.returncode != 0 and not venv.exists()
    assert "make setup: needs Python 3.11, 3.12 or 3.13 (PY=''): install one, or pass PY=" in none.stderr
