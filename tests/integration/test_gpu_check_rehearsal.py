"""The prepared GPU check rehearsed on this CPU (benchmarks/gpu_check.sh with GPU_CHECK_REHEARSE=1): every step's CPU
stand-in runs and passes, the vLLM, Ray and second-GPU rows skip by name, and the table is printed, so the script
that will meet the first GPU is known to work up to the CUDA kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_rehearsal_passes_and_prints_one_table(tmp_path):
    env = {**os.environ, "GPU_CHECK_REHEARSE": "1", "VENV": str(Path(sys.executable).parent.parent)}
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_check.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    table = run.stdout
    steps = ("learner", "flex", "fsdp", "hf_engine", "cuda_ipc", "colocated", "colocated_memory", "step_0p5b")
    for step in (*steps, "learner_speed"):
        assert any(line.split("|")[1:3] and step in line and "| ok" in line for line in table.splitlines()), step
    for skipped in ("vllm", "ray", "two_gpus"):
        assert any(skipped in line and "skipped: needs" in line for line in table.splitlines()), skipped
