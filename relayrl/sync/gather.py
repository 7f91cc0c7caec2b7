"""Weight sync from a sharded learner: gather one bucket's parameters, stream it, drop it, take the next.

Every rank walks the sync layout's buckets in the same order and calls `full_tensor()` (an all-gather of the
shards) on each parameter of the bucket; only rank 0 holds a transport sender. Rank 0 packs the gathered
tensors into its one bucket buffer and publishes that bucket through the ordinary transport (checksum and
version as for any push) before the next bucket is gathered. The gather of the learner group and the send
of the sync group run one after the other on one thread, so they never interleave.

On rank 0 the sync holds at most two buckets beyond the sharded model: the reused bucket buffer and the
gathered tensors of one bucket (a tensor larger than `sync.bucket_mb` is a bucket of its own). `HeldBytes`
counts what is really alive (a tensor's bytes are released when it is freed), so a test can check it.
Under `shm` the buckets are the shared segments the engines map (the whole model, as on one rank); the heap
holds only the gathered bucket.

Every transport takes a whole push in one `send_weights` call, as from one learner: shm and object_store
publish bucket by bucket (segments, refs); disk writes its safetensors file bucket by bucket; broadcast sends
each bucket's checksum after its bytes (a trailer), so every bucket is gathered once, checksums on or off.
"""

from __future__ import annotations

import json
import os
import struct
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from relayrl.errors import SyncError
from relayrl.sync.buckets import BucketLayout, checksum, pack
from relayrl.sync.transports import BroadcastSender, DiskSender, Manifest, ObjectStoreSender, Sender, make_sender


@dataclass
class HeldBytes:
    """Bytes of sync tensors alive on this rank now, and the most at any one time."""

    now: int = 0
    peak: int = 0

    def hold(self, tensor: torch.Tensor) -> torch.Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        self.now += nbytes
        self.peak = max(self.peak, self.now)
        weakref.finalize(tensor, self._release, nbytes)
        return tensor

    def _release(self, nbytes: int) -> None:
        self.now -= nbytes


def one_buffer(layout: BucketLayout, held: HeldBytes, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Every bucket a view of one buffer the size of the largest: each is published before the next is packed."""
    buffer = held.hold(torch.empty(max(layout.bucket_sizes), dtype=layout.dtype, device=device))
    return [buffer[:size] for size in layout.bucket_sizes]


_STREAMING = {"disk": DiskSender, "object_store": ObjectStoreSender, "broadcast": BroadcastSender}


def streaming_sender(kind, layout: BucketLayout, checksum: bool, group, timeout_s: float, directory, owner) -> Sender:
    """The transport's sender, with one reused bucket buffer (shm keeps its shared segments)."""
    held = HeldBytes()
    if kind == "shm":
        sender = make_sender(kind, layout, checksum, group, timeout_s, directory or None, owner)
        sender.held = held
        return sender
    args = {
        "disk": (layout, checksum, directory or None),
        "object_store": (layout, checksum),
        "broadcast": (layout, checksum, group, timeout_s),
    }
    if kind not in args:
        raise SyncError(f"sync.transport={kind!r} cannot carry weights from sharded learner ranks")
    device = group.device if kind == "broadcast" else "cpu"  # a broadcast packs on the sync group's device
    sender = _STREAMING[kind](*args[kind], buckets=one_buffer(layout, held, device))
    sender.held = held
    return sender


@dataclass(frozen=True)
class SyncPlan:
    """What every rank must know of a push to join its gathers in step: rank 0's transport and checksum."""

    transport: str
    checksum: bool


def send_from_shards(
    model, layout: BucketLayout, plan: SyncPlan, sender: Sender | None, version: int, only: list[int] | None = None
) -> Manifest | None:
    """Gather and send the buckets `only` (all by default), one bucket at a time. Every rank calls this (rank 0
    with its sender, the others with None, returning None); rank 0 returns one manifest for them all."""
    chosen = list(range(len(layout.bucket_sizes))) if only is None else list(only)
    model.reshard()  # a no-grad forward leaves the root's parameters gathered
    params = dict(model.named_parameters())

    def gathered(bucket: int) -> list[tuple[str, torch.Tensor]]:
        return [(slot.name, params[slot.name].full_tensor().detach()) for slot in layout.bucket_slots(bucket)]

    if sender is None:
        for bucket in chosen:
            gathered(bucket)  # this rank's part is the all-gathers, one per bucket
        return None

    def packed(bucket: int) -> torch.Tensor:
        tensors = [(name, sender.held.hold(tensor)) for name, tensor in gathered(bucket)]  # counted until freed
        pack(tensors, layout, sender.buckets, {bucket})
        return sender.buckets[bucket]

    start = time.perf_counter()
    if plan.transport == "disk" and len(chosen) > 1:
        return _stream_file(sender, chosen, packed, version, start)
    if plan.transport == "broadcast" and len(chosen) > 1:
        return _stream_broadcast(sender, chosen, packed, version, start)
    manifests = [
        sender.send([(name, sender.held.hold(tensor)) for name, tensor in gathered(bucket)], version, [bucket])
        for bucket in chosen
    ]
    return _joined(manifests, version, chosen, time.perf_counter() - start)


def _joined(manifests: list[Manifest], version: int, chosen: list[int], seconds: float) -> Manifest:
    """One manifest for buckets published one at a time: checksums in order; object-store refs joined."""
    first = manifests[0]
    sums = None if first.checksums is None else [s for m in manifests for s in m.checksums or ()]
    handle = [ref for m in manifests for ref in m.handle] if isinstance(first.handle, list) else first.handle
    return Manifest(version, sums, handle, sum(m.nbytes for m in manifests), seconds, chosen)


def _nbytes(sender: Sender, chosen: list[int]) -> int:
    return sum(sender.layout.bucket_sizes[i] for i in chosen) * sender.layout.dtype.itemsize


def _stream_file(sender, chosen: list[int], packed, version: int, start: float) -> Manifest:
    """The disk transport's safetensors file (one tensor per bucket, the version in its metadata), written
    bucket by bucket under a temporary name and renamed into place, as DiskSender writes it whole."""
    layout, item = sender.layout, sender.layout.dtype.itemsize
    entries: dict[str, Any] = {"__metadata__": {"version": str(version)}}
    offset = 0
    for i in chosen:
        size = layout.bucket_sizes[i] * item
        entries[f"bucket_{i}"] = {"dtype": _SAFETENSORS_DTYPE[layout.dtype], "shape": [layout.bucket_sizes[i]]}
        entries[f"bucket_{i}"]["data_offsets"] = [offset, offset + size]
        offset += size
    header = json.dumps(entries).encode()
    header += b" " * (-len(header) % 8)
    tmp, sums = sender.path.with_suffix(".tmp"), []
    with open(tmp, "wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        for i in chosen:
            bucket = packed(i)
            if sender.verify_checksums:
                sums.append(checksum(bucket))
            out.write(bucket.view(torch.uint8).numpy().tobytes())
    os.replace(tmp, sender.path)
    sums = sums if sender.verify_checksums else None
    return Manifest(version, sums, str(sender.path), _nbytes(sender, chosen), time.perf_counter() - start, chosen)


_SAFETENSORS_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16"}


def _stream_broadcast(sender, chosen: list[int], packed, version: int, start: float) -> Manifest:
    """BroadcastSender's protocol (the version, then each bucket and its checksum), each bucket gathered once."""
    sums = sender.stream(version, chosen, packed)
    return Manifest(version, sums, None, _nbytes(sender, chosen), time.perf_counter() - start, chosen)
