"""`relayrl bench sync`: how fast each transport moves a model of N parameters from one actor to another.

A synthetic transformer-shaped model (embedding, per layer 4 attention and 3 MLP matrices and 2 norms) sits
in a sender actor; receiver actors hold a copy of the same shapes and copy every pushed tensor into it,
as an engine's `load_weights` does. Both ends are driven by `RaySync`, the code path of a training run.
Each transport is timed three ways: one push of every bucket (what training does), one send/receive call
pair per bucket, and one per tensor (the per-parameter protocol bucketing replaces), beside the memcpy
ceiling measured in the same run and the cost model's prediction `T = P * b * r / BW` with BW = that
ceiling. One thread per actor.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

import torch

from relayrl.config import SyncConfig
from relayrl.sync.endpoints import WeightSink, WeightSource


def synthetic_shapes(params: int) -> list[tuple[str, tuple[int, ...]]]:
    """SmolLM-135M's tensor shapes (hidden 576, grouped-query k/v of 192, MLP 1536, vocab 49152, untied
    head), with as many layers as bring the total to about `params`: a real model's mix of large matrices
    and many small norms, which is what bucketing is for. Below ~60M parameters SmolLM's vocabulary alone
    would exceed the budget, so it shrinks to take half of it (the smallest model is one layer, ~3.5M)."""
    hidden, kv, mlp, vocab = 576, 192, 1536, 49_152
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp + 2 * hidden
    if params - 2 * vocab * hidden < per_layer:
        vocab = max(1, int(params) // (4 * hidden))
    layers = max(1, round((params - 2 * vocab * hidden) / per_layer))
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.weight", (kv, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "mlp.gate_proj.weight", (mlp, hidden)),
            (p + "mlp.up_proj.weight", (mlp, hidden)),
            (p + "mlp.down_proj.weight", (hidden, mlp)),
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    return shapes + [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


class SyntheticSource(WeightSource):
    def __init__(self, shapes, seed: int = 0, adopt: bool = True):
        torch.set_num_threads(1)
        self.adopt = adopt
        g = torch.Generator().manual_seed(seed)
        self.weights = [(name, torch.randn(shape, generator=g)) for name, shape in shapes]

    def named_weights(self):
        return iter(self.weights)

    def adoptable_parameters(self):
        return iter(self.weights) if self.adopt else None

    def memcpy_gbps(self, repeats: int = 5) -> float:
        """The ceiling: one copy of the model's bytes between two buffers in this process."""
        total = sum(t.numel() for _, t in self.weights)
        src, dst = torch.randn(total), torch.empty(total)
        dst.copy_(src)  # first touch
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
        return total * 4 / statistics.median(times) / 1e9

    def ping(self) -> int:
        return 0


class CopyingSink(WeightSink):
    def __init__(self, shapes):
        torch.set_num_threads(1)
        self.weights = {name: torch.zeros(shape) for name, shape in shapes}
        self.version = 0

    def load_weights(self, named_tensors, version: int) -> None:
        for name, tensor in named_tensors:
            self.weights[name].copy_(tensor)
        self.version = version

    def fingerprint(self) -> float:
        return float(sum(t.double().sum() for t in self.weights.values()))

    def ping(self) -> int:
        return 0


@dataclass
class Row:
    transport: str
    bucketing: str
    buckets: int
    seconds: float
    gbps: float


def run(
    params: int,
    transports: list[Literal["auto", "inprocess", "shm", "broadcast", "disk", "object_store"]],  # sync.transport
    receivers: int = 1,
    repeats: int = 3,
    checksum: bool = True,
    bucket_mb: float = 64.0,
    wire_dtype: Literal["fp32", "bf16"] = "fp32",
    timeout_s: float = 300.0,
    adopt: bool = True,
) -> dict:
    import ray

    from relayrl.placement.handles import RemoteRole
    from relayrl.sync.remote import RaySync

    if not ray.is_initialized():
        ray.init(num_cpus=max(2, receivers + 1), include_dashboard=False, log_to_driver=False)
    shapes = synthetic_shapes(params)
    source_actor = ray.remote(num_cpus=0)(SyntheticSource).remote(shapes, adopt=adopt)
    sink_actors = [ray.remote(num_cpus=0)(CopyingSink).remote(shapes) for _ in range(receivers)]
    source = RemoteRole(source_actor, "sender", timeout_s)
    sinks = [RemoteRole(a, f"receiver {i}", timeout_s) for i, a in enumerate(sink_actors)]
    source.ping()
    for sink in sinks:
        sink.ping()
    group = SimpleNamespace(replicas=sinks, on_restart=None, recover=_no_recovery)
    memcpy = source.memcpy_gbps()
    expected = sum(float(t.double().sum()) for t in _regenerate(shapes))
    rows = []
    for transport in transports:
        for bucketing, size, in_calls in (
            ("one push", bucket_mb, False),
            ("bucket calls", bucket_mb, True),
            ("tensor calls", 0.0, True),
        ):
            options = SyncConfig(
                transport=transport, bucket_mb=size, wire_dtype=wire_dtype, checksum=checksum, timeout_s=timeout_s
            )
            sync = RaySync(options, transport)
            rows.append(_measure(sync, bucketing, source, group, sinks, in_calls, repeats, expected))
    nbytes = sum(_numel(s) for _, s in shapes) * (4 if wire_dtype == "fp32" else 2)
    for actor in [source_actor, *sink_actors]:
        ray.kill(actor)
    return {
        "params": sum(_numel(s) for _, s in shapes),
        "tensors": len(shapes),
        "bytes": nbytes,
        "receivers": receivers,
        "memcpy_gbps": memcpy,
        "predicted_s": nbytes * receivers / (memcpy * 1e9),
        "checksum": checksum,
        "adopt": adopt,
        "rows": rows,
    }


def _numel(shape) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def _regenerate(shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g) for _, shape in shapes]


def _measure(sync, bucketing: str, source, group, sinks, in_calls: bool, repeats: int, expected: float) -> Row:
    """One (transport, bucketing) row: a warm push, then the median of `repeats` timed pushes."""
    options = sync.options
    sync.setup(source, group)
    push = sync.push_in_calls if in_calls else sync.push
    push(source, group)  # warm: first touch of fresh pages, connections
    times, gbps = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        push(source, group)
        times.append(time.perf_counter() - start)
        gbps.append(sync.last["sync/GBps"])
    if options.wire_dtype == "fp32":  # every receiver holds exactly the sender's weights
        for sink in sinks:
            assert abs(sink.fingerprint() - expected) <= 1e-6 * abs(expected) + 1e-3, options.transport
    source.close_sender()
    return Row(
        options.transport, bucketing, len(sync.layout.bucket_sizes), statistics.median(times), statistics.median(gbps)
    )


def _no_recovery(index, failure, seen=None):
    raise failure


def table(result: dict) -> str:
    gb = result["bytes"] / 1e9
    lines = [
        f"model: {result['params'] / 1e6:.0f}M parameters in {result['tensors']} tensors, {gb:.2f} GB on the wire, "
        f"{result['receivers']} receiver(s), checksums {'on' if result['checksum'] else 'off'}, "
        f"shm {'zero-copy (weights live in shared memory)' if result['adopt'] else 'packs a copy per push'}",
        f"memcpy ceiling (same run): {result['memcpy_gbps']:.2f} GB/s; predicted P*b*r/BW = "
        f"{result['predicted_s']:.3f} s",
        "",
        f"{'transport':<13} {'protocol':<13} {'buckets':>7} {'seconds':>8} {'GB/s':>6} {'of memcpy':>9} "
        f"{'vs tensor calls':>15}",
    ]
    rows = result["rows"]
    for row in rows:
        base = next(r for r in rows if r.transport == row.transport and r.bucketing == "tensor calls")
        speedup = f"{base.seconds / row.seconds:.2f}x" if row is not base else ""
        lines.append(
            f"{row.transport:<13} {row.bucketing:<13} {row.buckets:>7} {row.seconds:>8.3f} {row.gbps:>6.2f} "
            f"{row.gbps / result['memcpy_gbps']:>8.0%} {speedup:>15}"
        )
    return "\n".join(lines)
