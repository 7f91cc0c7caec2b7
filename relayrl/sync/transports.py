"""Weight transports between processes: a sender on the learner, a receiver on each engine.

Every transport moves the same bucket buffers (see `buckets.py`) and returns a `Manifest`: the policy
version, a checksum per bucket and whatever handle the receiver needs (segment names, a file, object
refs). Receivers verify every bucket before they yield a single tensor, so a corrupt transfer never
reaches the engine half-applied.

- `shm`: one POSIX shared-memory segment per bucket under /dev/shm, created once and reused every step
  (first touch of fresh pages costs 5-10x, so buffers live as long as the run). Segments are named
  `relayrl_<owner pid>_<creator pid>_<id>-<bucket>` (owner: the run's driver); the sync unlinks them once
  every receiver has mapped them, and each new sender sweeps away segments whose owner or creator is dead,
  so a killed run leaves nothing behind in /dev/shm beyond the next run's start.
- `disk`: one safetensors file, written under a temporary name and renamed into place.
- `object_store`: Ray's object store, one numpy array per bucket; refs are owned by the sender.
- `broadcast`: a torch.distributed group of its own (relayrl/sync/group.py: gloo on CPU, nccl on GPU) spanning the sender
  (rank 0) and every receiver, separate from any group the learner uses, with a timeout on every call. A push is
  a header (the version), then each bucket followed by its checksum (a trailer), so a sharded learner gathers each
  bucket once. Under NCCL the buckets never leave the GPUs and checksums are off (hashing is a host copy of every
  bucket on the learner and every worker): both ends skip them, and the sender's log says so.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from relayrl.errors import SyncError
from relayrl.run.preflight import shm_problem
from relayrl.sync.buckets import BucketLayout, checksum, pack, unpack, verify
from relayrl.sync.group import SyncGroup, _broadcast, as_bytes, checks_over, join_group, receive_value, send_value
from relayrl.sync.segments import SHM_DIR, sweep_segments

TRANSPORTS = ("shm", "disk", "object_store", "broadcast")
log = logging.getLogger(__name__)


@dataclass
class Manifest:
    version: int
    checksums: list[int] | None  # one per bucket in `buckets`
    handle: Any = None
    nbytes: int = 0
    send_seconds: float = 0.0
    buckets: list[int] | None = None  # the buckets this push carries (None: all of them)


class Sender:
    """Packs the learner's tensors into buckets and publishes them."""

    held: Any = None  # a sharded learner's streaming sender counts the sync tensors alive (sync/gather.py)

    def __init__(self, layout: BucketLayout, verify_checksums: bool = True, buckets: list[torch.Tensor] | None = None):
        """`buckets`: where to pack (one per bucket of `layout`); default fresh buffers of the transport's kind."""
        self.layout = layout
        self.verify_checksums = verify_checksums
        self.buckets = self._allocate() if buckets is None else buckets

    def _allocate(self) -> list[torch.Tensor]:
        return self.layout.empty_buckets()

    def send(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, only: list[int] | None = None
    ) -> Manifest:
        """Publish every bucket, or only the buckets `only` (one call per bucket or tensor: the protocol a
        benchmark compares a single push against); `named_tensors` must cover what is sent."""
        start = time.perf_counter()
        chosen = list(range(len(self.buckets))) if only is None else only
        pack(named_tensors, self.layout, self.buckets, None if only is None else set(only))
        sums = [checksum(self.buckets[i]) for i in chosen] if self.verify_checksums else None
        handle = self._publish(version, chosen)
        nbytes = sum(self.layout.bucket_sizes[i] for i in chosen) * self.layout.dtype.itemsize
        return Manifest(version, sums, handle, nbytes, time.perf_counter() - start, only)

    def _publish(self, version: int, chosen: list[int]) -> Any:
        return None

    def adopt(self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]]) -> int:
        """Move the learner's parameters into the transport's own memory (shm); how many moved (none here)."""
        return 0

    def unlink(self) -> None:
        """Every receiver holds a mapping: drop what only names the weights (shm's segment names)."""

    def close(self) -> None:
        pass


class Receiver:
    """Fetches the buckets a manifest describes, verifies them and yields the named tensors."""

    def __init__(self, layout: BucketLayout):
        self.layout = layout

    def receive(self, manifest: Manifest) -> Iterator[tuple[str, torch.Tensor]]:
        chosen = list(range(len(self.layout.bucket_sizes))) if manifest.buckets is None else manifest.buckets
        fetched = self._fetch(manifest, chosen)
        if manifest.checksums is not None:
            verify(self.layout, fetched, manifest.checksums, manifest.version, chosen)
        return unpack(self.layout, fetched, chosen)

    def _fetch(self, manifest: Manifest, chosen: list[int]) -> list[torch.Tensor]:
        """The buckets `chosen`, in that order."""
        raise NotImplementedError

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------- shared memory


def _shm_buckets(prefix: str, layout: BucketLayout) -> list[torch.Tensor]:
    return [
        torch.from_file(f"{prefix}-{i}", shared=True, size=size, dtype=layout.dtype)
        for i, size in enumerate(layout.bucket_sizes)
    ]


class ShmSender(Sender):
    """With `adopt`, the learner's parameters are moved into the shared segments (their `.data` becomes a
    view of a bucket), so the optimizer writes the next weights straight into shared memory and a push
    copies nothing on this side: it only checksums. The engines then copy once, from shared memory into
    their own parameters. Without it (or with a bf16 wire), each push packs a copy first."""

    def __init__(self, layout: BucketLayout, verify_checksums: bool = True, owner: int | None = None):
        self.owner = owner or os.getpid()
        super().__init__(layout, verify_checksums)

    def _allocate(self) -> list[torch.Tensor]:
        sweep_segments()
        problem = shm_problem(self.layout.nbytes, len(self.layout.bucket_sizes), SHM_DIR)
        if problem:  # the segments are sparse files: too small a /dev/shm is a SIGBUS at the first pack
            raise SyncError(problem)
        self.prefix = f"{SHM_DIR}/relayrl_{self.owner}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        return _shm_buckets(self.prefix, self.layout)

    def unlink(self) -> None:
        """Remove the segments' names; every mapping (ours, and the receivers' made so far) stays valid, and
        the memory is freed when the last one goes, however the processes end."""
        for i in range(len(self.layout.bucket_sizes)):
            Path(f"{self.prefix}-{i}").unlink(missing_ok=True)

    def adopt(self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]]) -> int:
        """Re-home every parameter whose dtype is the wire dtype into its slot; returns how many moved."""
        slots, moved = {s.name: s for s in self.layout.slots}, 0
        for name, param in named_parameters:
            slot = slots.get(name)
            if slot is None or param.dtype != self.layout.dtype or param.device.type != "cpu":
                continue
            view = self.buckets[slot.bucket][slot.offset : slot.offset + slot.numel].view(slot.shape)
            view.copy_(param.data)
            param.data = view
            moved += 1
        return moved

    def _publish(self, version: int, chosen: list[int]) -> str:
        return self.prefix

    def close(self) -> None:
        self.unlink()


class ShmReceiver(Receiver):
    def __init__(self, layout: BucketLayout):
        super().__init__(layout)
        self.prefix, self.buckets = None, []

    def _fetch(self, manifest: Manifest, chosen: list[int]) -> list[torch.Tensor]:
        if manifest.handle != self.prefix:  # attach once; the segments are reused every step
            missing = [i for i in range(len(self.layout.bucket_sizes)) if not Path(f"{manifest.handle}-{i}").exists()]
            if missing:
                raise SyncError(
                    f"shared-memory segment {manifest.handle}-{missing[0]} does not exist "
                    "(the sender closed or unlinked it, or it runs on another machine: use "
                    "sync.transport=broadcast)"
                )
            self.prefix, self.buckets = manifest.handle, _shm_buckets(manifest.handle, self.layout)
        return [self.buckets[i] for i in chosen]


# ---------------------------------------------------------------------------- disk


class DiskSender(Sender):
    def __init__(self, layout: BucketLayout, verify_checksums: bool = True, directory: str | None = None, buckets=None):
        super().__init__(layout, verify_checksums, buckets)
        self.directory = Path(directory or tempfile.mkdtemp(prefix="relayrl-sync-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "weights.safetensors"

    def _publish(self, version: int, chosen: list[int]) -> str:
        from safetensors.torch import save_file

        tmp = self.path.with_suffix(".tmp")
        save_file({f"bucket_{i}": self.buckets[i] for i in chosen}, str(tmp), metadata={"version": str(version)})
        os.replace(tmp, self.path)
        return str(self.path)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


class DiskReceiver(Receiver):
    def _fetch(self, manifest: Manifest, chosen: list[int]) -> list[torch.Tensor]:
        from safetensors import safe_open

        with safe_open(manifest.handle, framework="pt") as f:
            found = f.metadata().get("version")
            if found != str(manifest.version):
                raise SyncError(
                    f"{manifest.handle} holds policy version {found}, expected {manifest.version} "
                    "(two runs share the sync directory?)"
                )
            return [f.get_tensor(f"bucket_{i}") for i in chosen]


# ---------------------------------------------------------------------------- Ray object store


class ObjectStoreSender(Sender):
    def _publish(self, version: int, chosen: list[int]) -> list:
        import ray

        self.refs = [
            ray.put(
                self.buckets[i].numpy()
                if self.layout.dtype != torch.bfloat16
                else self.buckets[i].view(torch.int16).numpy()
            )
            for i in chosen
        ]  # numpy has no bf16
        return self.refs


class ObjectStoreReceiver(Receiver):
    def __init__(self, layout: BucketLayout, timeout_s: float = 60.0):
        super().__init__(layout)
        self.timeout_s = timeout_s

    def _fetch(self, manifest: Manifest, chosen: list[int]) -> list[torch.Tensor]:
        import ray

        arrays = ray.get(manifest.handle, timeout=self.timeout_s)
        buckets = [torch.from_numpy(a.copy() if not a.flags.writeable else a) for a in arrays]
        return [b.view(torch.bfloat16) if self.layout.dtype == torch.bfloat16 else b for b in buckets]


# ---------------------------------------------------------------------------- torch.distributed broadcast


class BroadcastSender(Sender):
    """A push: the version, then each bucket and (checksums on) its checksum, so every bucket is packed (a sharded
    learner: gathered) once and hashed just before it is sent."""

    def __init__(self, layout: BucketLayout, verify_checksums: bool, group: SyncGroup, timeout_s: float, buckets=None):
        self.group, self.timeout_s = group, timeout_s  # before the buckets: they are allocated on its device
        if verify_checksums and not checks_over(group, True):
            log.info("sync.checksum is off for this push: NCCL carries the buckets GPU to GPU, no host copy to hash")
        super().__init__(layout, checks_over(group, verify_checksums), buckets)

    def _allocate(self) -> list[torch.Tensor]:
        return self.layout.empty_buckets(self.group.device)

    def send(self, named_tensors, version: int, only: list[int] | None = None) -> Manifest:
        start = time.perf_counter()
        chosen = list(range(len(self.buckets))) if only is None else only
        pack(named_tensors, self.layout, self.buckets, None if only is None else set(only))
        sums = self.stream(version, chosen, lambda i: self.buckets[i])
        nbytes = sum(self.layout.bucket_sizes[i] for i in chosen) * self.layout.dtype.itemsize
        return Manifest(version, sums, None, nbytes, time.perf_counter() - start, only)

    def stream(self, version: int, chosen: list[int], bucket_of) -> list[int] | None:
        """The push of buckets `chosen`, each made by `bucket_of(i)` just before it is sent; the checksums sent."""
        send_value(self.group, version, self.timeout_s)
        sums = []
        for i in chosen:
            bucket = bucket_of(i)
            _broadcast(self.group, as_bytes(bucket), self.timeout_s)
            if self.verify_checksums:
                sums.append(send_value(self.group, self.checksum_of(i, bucket), self.timeout_s))
        return sums if self.verify_checksums else None

    def checksum_of(self, index: int, bucket: torch.Tensor) -> int:
        return checksum(bucket)


def _receive_version(group: SyncGroup, expected: int, timeout_s: float) -> int:
    version = receive_value(group, timeout_s)
    if version != expected:
        raise SyncError(f"broadcast carried policy version {version}, expected {expected}")
    return version


class BroadcastReceiver(Receiver):
    def __init__(self, layout: BucketLayout, verify_checksums: bool, group, timeout_s: float):
        super().__init__(layout)
        self.verify_checksums, self.group, self.timeout_s = checks_over(group, verify_checksums), group, timeout_s
        self.buckets = layout.empty_buckets(group.device)

    def receive(self, manifest: Manifest) -> Iterator[tuple[str, torch.Tensor]]:
        chosen = list(range(len(self.buckets))) if manifest.buckets is None else manifest.buckets
        version = _receive_version(self.group, manifest.version, self.timeout_s)
        sums = []
        for bucket in (self.buckets[i] for i in chosen):
            _broadcast(self.group, as_bytes(bucket), self.timeout_s)
            if self.verify_checksums:
                sums.append(receive_value(self.group, self.timeout_s))
        fetched = [self.buckets[i] for i in chosen]
        if self.verify_checksums:
            verify(self.layout, fetched, sums, version, chosen)
        return unpack(self.layout, fetched, chosen)


class StreamingBroadcastReceiver(Receiver):
    """The broadcast's receiving end in a process that loads each bucket as it arrives (a vLLM worker:
    relayrl/rollout/vllm_transfer.py): one fresh bucket on the device at a time, never the whole model (a worker of
    a T-GPU engine would otherwise hold a full copy on each GPU). Each bucket is verified before its tensors are
    yielded; a later bucket can still fail after earlier ones loaded, and the engine then refuses to serve (a push
    that fails part-way, as a push in several RPC calls can). A corrupt bucket is raised once the rest of the push
    has been received, so the sender is never left waiting. Fresh buckets, not reused: vLLM's layerwise reload keeps
    the tensors of a layer until all of it has arrived."""

    def __init__(self, layout: BucketLayout, verify_checksums: bool, group: SyncGroup, timeout_s: float):
        super().__init__(layout)
        self.verify_checksums, self.group, self.timeout_s = checks_over(group, verify_checksums), group, timeout_s

    def receive(self, manifest: Manifest) -> Iterator[tuple[str, torch.Tensor]]:
        chosen = list(range(len(self.layout.bucket_sizes))) if manifest.buckets is None else manifest.buckets
        version, corrupt = _receive_version(self.group, manifest.version, self.timeout_s), None
        for index in chosen:
            bucket = torch.empty(self.layout.bucket_sizes[index], dtype=self.layout.dtype, device=self.group.device)
            _broadcast(self.group, as_bytes(bucket), self.timeout_s)
            want = receive_value(self.group, self.timeout_s) if self.verify_checksums else None
            if corrupt is not None:  # received and dropped: the sender's broadcast completes, the push fails here
                continue
            try:
                if want is not None:
                    verify(self.layout, [bucket], [want], version, [index])
            except SyncError as err:
                corrupt = err
                continue
            yield from unpack(self.layout, [bucket], [index])
        if corrupt is not None:
            raise corrupt


@dataclass
class WorkerMembership:
    """One receiving member of the weight-sync group, handed to a vLLM engine's worker (relayrl/rollout/vllm_transfer.py),
    which holds it opaquely (rollout/ never imports sync/): it joins at `rank_offset` + the worker's rank, opens a
    streaming receiver for the bucket layout, and gives each push's tensors."""

    address: str
    port: int
    rank_offset: int  # the engine's first rank in the group
    world: int
    timeout_s: float
    receiver: StreamingBroadcastReceiver | None = None
    group: SyncGroup | None = None

    def join(self, worker_rank: int) -> None:
        self.group = join_group(self.address, self.port, self.rank_offset + worker_rank, self.world, self.timeout_s)

    def open(self, layout: BucketLayout, verify_checksums: bool) -> None:
        self.receiver = StreamingBroadcastReceiver(layout, verify_checksums, _joined(self.group), self.timeout_s)

    def receive(self, version: int, buckets: list[int] | None) -> Iterator[tuple[str, torch.Tensor]]:
        if self.receiver is None:
            raise SyncError("no weight-sync receiver in this worker: open_weight_receivers comes before a push")
        return self.receiver.receive(Manifest(version, None, buckets=buckets))


def make_sender(
    kind: str,
    layout: BucketLayout,
    verify_checksums: bool = True,
    group=None,
    timeout_s: float = 60.0,
    directory: str | None = None,
    owner: int | None = None,
) -> Sender:
    if kind == "shm":
        return ShmSender(layout, verify_checksums, owner)
    if kind == "disk":
        return DiskSender(layout, verify_checksums, directory)
    if kind == "object_store":
        return ObjectStoreSender(layout, verify_checksums)
    if kind == "broadcast":
        return BroadcastSender(layout, verify_checksums, _joined(group), timeout_s)
    raise SyncError(f"sync.transport={kind!r}: expected one of {', '.join(TRANSPORTS)}")


def make_receiver(
    kind: str, layout: BucketLayout, verify_checksums: bool = True, group=None, timeout_s: float = 60.0
) -> Receiver:
    if kind == "shm":
        return ShmReceiver(layout)
    if kind == "disk":
        return DiskReceiver(layout)
    if kind == "object_store":
        return ObjectStoreReceiver(layout, timeout_s)
    if kind == "broadcast":
        return BroadcastReceiver(layout, verify_checksums, _joined(group), timeout_s)
    raise SyncError(f"sync.transport={kind!r}: expected one of {', '.join(TRANSPORTS)}")


def _joined(group: SyncGroup | None) -> SyncGroup:
    if group is None:
        raise SyncError("the broadcast transport needs the weight-sync group: join_sync_group comes first")
    return group
