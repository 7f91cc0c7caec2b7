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

Protocol: shm and object_store push every bucket in one `send_weights` call (one manifest). disk rewrites one
file and broadcast sends a header per call, so they go one bucket per call (`RaySync.push_in_calls`).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import torch

from relayrl.errors import SyncError
from relayrl.sync.buckets import Layout
from relayrl.sync.transports import (
    BroadcastSender,
    DiskSender,
    Manifest,
    ObjectStoreSender,
    Sender,
    ShmSender,
    make_sender,
)


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


def _streaming(cls: type) -> type:
    class Streaming(cls):
        """Every bucket a view of one buffer the size of the largest: each is published before the next is packed."""

        def __init__(self, held: HeldBytes, *args):
            self.held = held  # before the base __init__, which allocates
            super().__init__(*args)

        def _allocate(self) -> list[torch.Tensor]:
            buffer = self.held.hold(torch.empty(max(self.layout.bucket_sizes), dtype=self.layout.dtype))
            return [buffer[:size] for size in self.layout.bucket_sizes]

    Streaming.__name__ = f"Streaming{cls.__name__}"
    return Streaming


_STREAMING = {"disk": _streaming(DiskSender), "object_store": _streaming(ObjectStoreSender)}
_STREAMING["broadcast"] = _streaming(BroadcastSender)


def streaming_sender(kind, layout: Layout, checksum: bool, group, timeout_s: float, directory, owner) -> Sender:
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
    return _STREAMING[kind](held, *args[kind])


def send_from_shards(model, layout: Layout, sender: Sender | None, version: int, only: list[int] | None = None):
    """Gather and send the buckets `only` (all by default), one bucket at a time. Every rank calls this (rank 0
    with its sender, the others with None, returning None); rank 0 returns one manifest for them all."""
    chosen = list(range(len(layout.bucket_sizes))) if only is None else list(only)
    if sender is not None and len(chosen) > 1 and not isinstance(sender, (ShmSender, ObjectStoreSender)):
        raise SyncError(
            f"{type(sender).__name__}: from sharded learner ranks a disk or broadcast push carries one bucket per "
            f"call (this one asked for {len(chosen)}); push one call per bucket"
        )
    model.reshard()  # a no-grad forward leaves the root's parameters gathered
    params = dict(model.named_parameters())
    start, manifests = time.perf_counter(), []
    for bucket in chosen:
        gathered = [(slot.name, params[slot.name].full_tensor().detach()) for slot in layout.bucket_slots(bucket)]
        if sender is None:
            continue  # this rank's part was the all-gathers
        [sender.held.hold(tensor) for _, tensor in gathered]  # counted until freed
        manifests.append(sender.send(gathered, version, [bucket]))
        del gathered  # freed before the next bucket is gathered
    if sender is None:
        return None
    return _joined(manifests, version, chosen, time.perf_counter() - start)


def _joined(manifests: list[Manifest], version: int, chosen: list[int], seconds: float) -> Manifest:
    """One manifest for buckets published one at a time: checksums in order; object-store refs joined."""
    first = manifests[0]
    sums = None if first.checksums is None else [s for m in manifests for s in m.checksums]
    handle = [ref for m in manifests for ref in m.handle] if isinstance(first.handle, list) else first.handle
    return Manifest(version, sums, handle, sum(m.nbytes for m in manifests), seconds, chosen)
