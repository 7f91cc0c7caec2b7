"""Hardware profiles for the planner, and a probe that measures this machine's CPU.

Figures are nominal per-device datasheet numbers (dense bf16, no sparsity); `link_gbs` is the effective
trainer -> engine bandwidth the weight sync sees (NVLink, PCIe, or a memcpy on CPU). Memory is in GB
(1e9 bytes), as the sizing arithmetic in the seeds is. Left out: multi-node fabrics, MIG slices, fp8 peaks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Hardware:
    name: str
    kind: str  # "gpu" (bf16 training) or "cpu" (fp32 training)
    memory_gb: float  # per device
    mem_bw_gbs: float  # HBM / DRAM bandwidth, GB/s
    peak_tflops: float  # dense peak of the training dtype: bf16 on GPU, fp32 on CPU
    link_gbs: float  # weight-sync bandwidth, GB/s
    mfu: float  # model FLOPs utilisation assumed for training and log-prob passes
    devices_per_node: int
    source: str = "nominal"


PROFILES = {
    "H100-80GB": Hardware("H100-80GB", "gpu", 80, 3350, 989, 450, 0.35, 8),  # SXM; 450 GB/s = seeds' NVLink figure
    "H200": Hardware("H200", "gpu", 141, 4800, 989, 450, 0.35, 8),
    "A100-80GB": Hardware("A100-80GB", "gpu", 80, 2039, 312, 300, 0.35, 8),
    "A10G": Hardware("A10G", "gpu", 24, 600, 70, 25, 0.35, 8),  # PCIe 4.0 x16, no NVLink
    "L4": Hardware("L4", "gpu", 24, 300, 121, 25, 0.35, 8),
    # This machine kind: 2 cores, 24 GB. A rough fp32 peak of small matmuls; plan.measure replaces it.
    # MFU 0.3 of the matmul rate: tiny models run many small kernels and the Python overhead shows.
    "cpu": Hardware("cpu", "cpu", 24, 10, 0.1, 10, 0.3, 1),
}


def get_profile(name: str, measure: bool = False) -> Hardware:
    from relayrl.errors import ConfigError

    if name not in PROFILES:
        raise ConfigError(f"unknown plan.hardware={name!r}; known: {', '.join(PROFILES)}")
    hardware = PROFILES[name]
    if measure:
        if hardware.kind != "cpu":
            raise ConfigError("plan.measure=true probes this machine's CPU; use it with plan.hardware=cpu")
        hardware = measure_cpu(hardware)
    return hardware


def measure_cpu(base: Hardware, copy_mb: int = 256, matmul_n: int = 1024, repeats: int = 3) -> Hardware:
    """`base` with bandwidth and fp32 FLOP/s measured here (best of `repeats`).

    Bandwidth: a torch copy of `copy_mb` MB counts read + write, 2 * bytes / t (STREAM's convention); the
    sync link on one machine is the same memcpy. FLOP/s: 2 * n^3 / t for an n x n fp32 matmul.
    """
    import torch

    warm_up()
    src = torch.empty(copy_mb * 1_000_000 // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    copy_s = best_time(lambda: dst.copy_(src), repeats)
    bandwidth_gbs = 2 * src.numel() * 4 / copy_s / 1e9
    a, b = torch.randn(matmul_n, matmul_n), torch.randn(matmul_n, matmul_n)
    matmul_s = best_time(lambda: a @ b, repeats)
    tflops = 2 * matmul_n**3 / matmul_s / 1e12
    return replace(
        base,
        mem_bw_gbs=round(bandwidth_gbs, 1),
        link_gbs=round(bandwidth_gbs, 1),
        peak_tflops=round(tflops, 6),  # 4 decimals read 0 under heavy load (a 128^3 probe)
        source=f"measured (copy {copy_mb} MB, matmul {matmul_n}^3)",
    )


def warm_up(seconds: float = 1.0) -> None:
    """Keep both cores busy with matmuls for `seconds` before timing anything: the first measurements of a
    process here ran ~3x slow (a 1024^3 matmul 61 vs 189 GFLOP/s, the demo's fwd+bwd 12 vs 146) until the
    thread pool and the cores' clocks were up."""
    import torch

    a = torch.randn(512, 512)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        _ = a @ a  # the work is the point; the product is dropped


def best_time(fn, repeats: int) -> float:
    fn()  # warm up: page faults, thread pool start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
