"""The two ends of a weight push, as mixins for whatever holds the weights.

`WeightSource` (the learner; the sync benchmark's synthetic sender) needs `named_weights()`;
`WeightSink` (an engine; the benchmark's receiver) needs `load_weights(named_tensors, version)`.
`RaySync` drives both through these method names, so the benchmark measures the production path.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch

from relayrl.sync.buckets import BucketLayout, layout_of
from relayrl.sync.group import join_group
from relayrl.sync.transports import Manifest, Receiver, Sender, make_receiver, make_sender

T = TypeVar("T")


class WeightSource:
    sender: Sender | None = None  # set by open_sender; the push methods run only after it
    sync_group = None

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError

    def weight_layout(self, bucket_mb: float, wire_dtype: str) -> BucketLayout:
        return layout_of(self.named_weights(), bucket_mb, wire_dtype)

    def join_sync_group(self, address: str, port: int, world: int, timeout_s: float) -> None:
        self.sync_group = join_group(address, port, 0, world, timeout_s)

    def adoptable_parameters(self):
        """Named parameters the shm transport may move into shared memory (None: copy on every push)."""
        return None

    def open_sender(
        self,
        transport: str,
        layout: BucketLayout,
        checksum: bool,
        timeout_s: float,
        directory: str,
        owner: int | None = None,
    ) -> int:
        """Returns how many parameters now live in shared memory (shm transport; 0 otherwise). `owner`: the
        driver's pid, which names the shared-memory segments (swept once it is gone)."""
        self.close_sender()
        self.sender = make_sender(transport, layout, checksum, self.sync_group, timeout_s, directory or None, owner)
        params = self.adoptable_parameters()
        return self.sender.adopt(params) if params is not None else 0

    def send_weights(self, version: int, only: list[int] | None = None) -> Manifest:
        return _opened(self.sender).send(self.named_weights(), version, only)

    def unlink_segments(self) -> None:
        """Every receiver has mapped the shared-memory segments: drop their names (nothing to leak later)."""
        _opened(self.sender).unlink()

    def close_sender(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None


class WeightSink:
    receiver: Receiver | None = None  # set by open_receiver
    sync_group = None

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        raise NotImplementedError

    def sync_ranks(self) -> int:
        """How many ranks of the broadcast group this end holds (an engine whose workers receive: one per worker)."""
        return 1

    def join_sync_group(self, address: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        self.sync_group = join_group(address, port, rank, world, timeout_s)

    def open_receiver(self, transport: str, layout: BucketLayout, checksum: bool, timeout_s: float) -> None:
        self.receiver = make_receiver(transport, layout, checksum, self.sync_group, timeout_s)

    def receive_weights(self, manifest: Manifest) -> float:
        """Fetch, verify and load one push; returns the seconds it took on this side."""
        start = time.perf_counter()
        self.load_weights(_opened(self.receiver).receive(manifest), manifest.version)
        return time.perf_counter() - start


def _opened(end: T | None) -> T:
    """A transport end that `open_sender` / `open_receiver` made; using one before is a bug of the caller."""
    if end is None:
        raise RuntimeError("the weight transport is not open: call open_sender / open_receiver first")
    return end
