"""The weight-sync process group: its own TCPStore and gloo or NCCL group (never the default one), joined by the
learner (rank 0) and every receiving end (an engine's actor, or each of a vLLM engine's workers), and the device
its collectives take tensors on. The broadcast transport's sender and receivers (relayrl/sync/transports.py) and a
sharded learner's streaming sender (relayrl/sync/gather.py) move every bucket through it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch

from relayrl.errors import SyncError


@dataclass(frozen=True)
class SyncGroup:
    """The weight-sync process group and the device its collectives take tensors on: CUDA for NCCL, CPU for gloo.
    Every tensor handed to it must be on that device (`broadcast` refuses any other: NCCL would refuse a CPU
    tensor, and the CPU suite, all gloo, then fails the same way)."""

    group: Any
    backend: str  # "nccl" or "gloo"
    device: torch.device

    def broadcast(self, tensor: torch.Tensor, timeout_s: float) -> None:
        if tensor.device != self.device:
            raise SyncError(
                f"a {tuple(tensor.shape)} tensor on {tensor.device} was handed to the weight-sync group, whose "
                f"{self.backend} collectives take tensors on {self.device}"
            )
        options = torch.distributed.BroadcastOptions()
        options.rootRank = 0
        work = self.group.broadcast([tensor], options)
        if not work.wait(datetime.timedelta(seconds=timeout_s)):
            raise SyncError(f"weight broadcast did not complete within {timeout_s} s")


def join_group(address: str, port: int, rank: int, world: int, timeout_s: float) -> SyncGroup:
    """A process group of its own (never the default one): TCPStore hosted by rank 0, gloo or nccl. Every member
    says its backend through the store first: a group whose sides differ (NCCL on a GPU learner, gloo on a CPU
    engine) is refused at join, naming both, instead of hanging at its first collective."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = torch.distributed.TCPStore(address, port, world, rank == 0, timeout=timeout)  # pyright: ignore[reportPrivateImportUsage] - exported at run time
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    check_backends(store, rank, world, backend, "the weight-sync group (rank 0 the learner, 1.. the engines)")
    if backend == "nccl":  # the same deadline as gloo's: a dead peer ends a collective, not the run
        options = torch.distributed.ProcessGroupNCCL.Options()  # pyright: ignore[reportAttributeAccessIssue] - CUDA builds only
        options._timeout = timeout
        group = torch.distributed.ProcessGroupNCCL(store, rank, world, options)  # pyright: ignore[reportAttributeAccessIssue] - CUDA builds only
        return SyncGroup(group, backend, torch.device("cuda", torch.cuda.current_device()))
    return SyncGroup(torch.distributed.ProcessGroupGloo(store, rank, world, timeout), backend, torch.device("cpu"))


def check_backends(store, rank: int, world: int, backend: str, what: str) -> None:
    """Every member's backend through `store`; raise SyncError naming the sides when they differ."""
    store.set(f"relayrl/backend/{rank}", backend)
    sides = {r: store.get(f"relayrl/backend/{r}").decode() for r in range(world)}
    if len(set(sides.values())) > 1:
        listed = ", ".join(f"rank {r}: {b}" for r, b in sides.items())
        raise SyncError(
            f"{what} mixes collective backends ({listed}): every member must see a GPU (nccl) or none (gloo)"
        )


def _broadcast(group: SyncGroup, tensor: torch.Tensor, timeout_s: float) -> None:
    group.broadcast(tensor, timeout_s)


def send_value(group: SyncGroup, value: int, timeout_s: float) -> int:
    """Rank 0 sends one int64 (a push's version, a bucket's checksum); returns it."""
    _broadcast(group, torch.tensor([value], dtype=torch.int64, device=group.device), timeout_s)
    return value


def receive_value(group: SyncGroup, timeout_s: float) -> int:
    """The int64 rank 0 sent with `send_value`."""
    received = torch.zeros(1, dtype=torch.int64, device=group.device)
    _broadcast(group, received, timeout_s)
    return int(received[0])


def checks_over(group: SyncGroup, wanted: bool) -> bool:
    """Whether a broadcast push over `group` carries checksums: as asked, except under NCCL (the buckets stay on the
    GPUs; a host hash would copy each one off the device on every end). Both ends decide alike: one backend."""
    return wanted and group.backend != "nccl"


def as_bytes(bucket: torch.Tensor) -> torch.Tensor:
    """A bucket as the bytes a broadcast moves: a bf16 bucket travels as uint8, which every backend takes (it went
    as int16 before, which gloo refuses: "Invalid scalar type", so `sync.wire_dtype=bf16` over gloo failed)."""
    return bucket.view(torch.uint8) if bucket.dtype == torch.bfloat16 else bucket
