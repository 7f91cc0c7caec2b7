"""The `sync` section: how the learner's weights reach the engines (the transport, its buckets, wire dtype,
checksums and deadline, a LoRA run's adapter or merged pushes), the keys each transport reads, and what
`sync.transport: auto` means for a placement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from relayrl.config.section import Section

if TYPE_CHECKING:
    from relayrl.config.root import Config


class SyncConfig(Section):
    transport: Literal["auto", "inprocess", "shm", "broadcast", "disk", "object_store"] = Field(
        default="auto",
        description="How weights reach the engines: auto = inprocess under placement.mode=local; under ray, shm "
        "on one node, broadcast when an engine is on another node than the learner.",
    )
    bucket_mb: float = Field(
        default=64.0, ge=0, description="Pack tensors into buckets of this many MiB (0 = one per tensor)."
    )
    wire_dtype: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="Dtype on the wire (bf16 halves the bytes): auto = bf16 where the engine serves bf16 (a GPU "
        "that supports it: fp32 would carry bytes the engine drops), fp32 otherwise.",
    )
    checksum: bool = Field(
        default=True,
        description="xxh3-64 checksum per bucket, verified by each engine before it loads anything (skipped, "
        "and logged, by a broadcast under NCCL: the buckets stay on the GPUs).",
    )
    parity_probe: bool | Literal["auto"] = Field(
        default="auto",
        description="After each push, compare engine and learner log-probs on a fixed sequence "
        "(sync/parity_abs_{max,mean}); a push that changes none of the engine's, or a gap past sync.max_mismatch, "
        "stops the run. auto = on under train.schedule=sync (one short forward on each side; an overlapped "
        "schedule's engine is generating at the push).",
    )
    max_mismatch: float = Field(
        default=0.05,
        ge=0,
        description="Stop the run when the engine's log-probs differ from the learner's by more than this on average "
        "(the parity probe after a push; the step's samples of the version being trained): the weights did not "
        "land. bf16 measured 0.007 (the demo on an H200), fp32 ~1e-7; 0 = off.",
    )
    timeout_s: float = Field(
        default=120.0, gt=0, description="Deadline for one push (every collective and wait within it)."
    )
    lora: Literal["auto", "adapter", "merged"] = Field(
        default="auto",
        description="With model.lora: push only the adapter (the engine loads each version as a new adapter), "
        "or merged full weights; auto = adapter on vLLM with a GPU, merged on CPU (faster there) and on HF.",
    )
    directory: str = Field(
        default="",
        description="disk transport: where the weights file goes ('' = a temporary "
        "directory); relative to the working directory (saved absolute).",
    )


# The sync settings each transport reads: the in-process transport hands tensors over (no wire, no deadline) but
# still runs the parity probe; only the disk transport writes into a directory.
_WIRE = {"transport", "bucket_mb", "wire_dtype", "checksum", "parity_probe", "max_mismatch", "timeout_s", "lora"}
SYNC_KEYS = {
    "inprocess": {"transport", "parity_probe", "max_mismatch", "lora"},
    "shm": _WIRE,
    "broadcast": _WIRE,
    "object_store": _WIRE,
    "disk": _WIRE | {"directory"},
}


def resolve_parity_probe(config: Config) -> tuple[bool, str]:
    """`sync.parity_probe: auto`: on where the engine idles at the push (train.schedule=sync)."""
    schedule = config.train.schedule
    if schedule == "sync":
        return True, "train.schedule=sync: the engine idles at the push, one short forward on each side"
    return False, f"train.schedule={schedule}: the engine is generating at the push"


def effective_transport(config: Config) -> str:
    """`sync.transport`, with `auto` resolved for the placement."""
    if config.sync.transport != "auto":
        return config.sync.transport
    return "inprocess" if config.placement.mode == "local" else "shm"
