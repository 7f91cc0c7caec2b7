"""Weight sync between Ray actors, driven from the controller: the learner sends, every engine receives.

`setup` agrees on the bucket layout (and, for `broadcast`, forms the dedicated process group); `push`
publishes the learner's weights under a new policy version and waits, with `sync.timeout_s`, until every
engine has verified and loaded them. A failed engine is restarted by the engine group, which calls back
here to re-attach and push the current version again. Metrics: bytes, seconds on each side, effective
GB/s and the version (the parity probe after it is the push guard's, relayrl/sync/guard.py).
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, cast

from relayrl.errors import RoleFailure
from relayrl.sync.base import RestartingEngines
from relayrl.sync.transports import Manifest

if TYPE_CHECKING:
    from relayrl.config import SyncConfig
    from relayrl.rollout.protocols import EngineGroup


def free_port() -> int:
    """A TCP port free on every interface of this node (a process group's store listens on all of them)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_address(_actor=None) -> tuple[str, int]:
    """This node's IP, as Ray reports it, and a free port there: the rendezvous of a process group whose store
    this process hosts, reachable from the other nodes. Run in the learner's actor (`__ray_call__` passes the
    actor instance first); never the loopback address, which on another node is that node."""
    import ray

    return ray.util.get_node_ip_address(), free_port()


class RaySync:
    def __init__(self, options: SyncConfig, transport: str, version: int = 0):
        self.options, self.transport, self.version = options, transport, version
        self.last: dict[str, float] = {}
        self.learner = self.engines = None
        self.tensors: list[str] = []  # the names a push carries (the layout's, once set up)
        self.sending: int | None = None  # the version of the push in flight, if any

    def setup(self, learner, engines: RestartingEngines) -> None:
        """`learner`: the learner actor's handle (relayrl/placement/handles.py), with the `WeightSource` methods."""
        o, replicas = self.options, engines.replicas
        self.learner, self.engines = learner, engines
        layout = learner.weight_layout(o.bucket_mb, o.wire_dtype)
        if self.transport == "broadcast":  # the learner (rank 0) hosts the group's store, on its own node
            where = learner.submit("__ray_call__", node_address)
            address, port = learner.wait(where, "choosing the weight-sync group's address", o.timeout_s)
            # a replica holds one rank (its actor receives) or T (a vLLM engine's T workers receive themselves)
            held = [
                r.wait(r.submit("sync_ranks"), "counting the weight-sync group's ranks", o.timeout_s) for r in replicas
            ]
            first = [1 + sum(held[:i]) for i in range(len(replicas))]
            world = 1 + sum(held)
            refs = [learner.submit("join_sync_group", address, port, world, o.timeout_s)]
            refs += [
                r.submit("join_sync_group", address, port, first[i], world, o.timeout_s) for i, r in enumerate(replicas)
            ]
            for role, ref in zip([learner, *replicas], refs):
                role.wait(ref, "joining the weight-sync group", o.timeout_s)
        self.adopted = learner.open_sender(self.transport, layout, o.checksum, o.timeout_s, o.directory, os.getpid())
        self.layout, self.mapped = layout, False
        self.tensors = [slot.name for slot in layout.slots]
        for replica in replicas:
            replica.open_receiver(self.transport, layout, o.checksum, o.timeout_s)
        engines.on_restart = self.reattach

    def reattach(self) -> None:
        """After an engine restart: a fresh group/receivers, and the learner's current weights under their own
        version (during a push, the version being pushed: the learner already holds those weights)."""
        assert self.engines is not None, "reattach runs after setup"
        self.setup(self.learner, self.engines)
        self.push(self.learner, self.engines, version=self.version if self.sending is None else self.sending)

    def push(self, learner, engines: EngineGroup, version: int | None = None) -> int:
        """`engines` is the Ray group `setup` attached (its replicas restart: a `RestartingEngines`)."""
        version = self.version + 1 if version is None else version
        previous, self.sending = self.sending, version  # a re-push after a restart nests inside a push
        try:
            return self._push(learner, cast(RestartingEngines, engines), version)
        finally:
            self.sending = previous

    def _push(self, learner, engines: RestartingEngines, version: int) -> int:
        timeout, replicas = self.options.timeout_s, list(engines.replicas)  # the actors this push talks to
        start = time.perf_counter()
        if self.transport == "broadcast":  # every rank must be in the collective at once
            sent = learner.submit("send_weights", version)
            received = [r.submit("receive_weights", Manifest(version, None)) for r in replicas]
            manifest = learner.wait(sent, "sending weights", timeout)
        else:
            manifest = learner.wait(learner.submit("send_weights", version), "sending weights", timeout)
            received = [r.submit("receive_weights", manifest) for r in replicas]
        receive_seconds = []
        for index, ref in enumerate(received):
            try:
                receive_seconds.append(replicas[index].wait(ref, "receiving weights", timeout))
            except RoleFailure as failure:
                # restarts it and re-pushes this version to every replica (unless another caller already did)
                engines.recover(index, failure, seen=replicas[index])
                receive_seconds.append(0.0)
        seconds = time.perf_counter() - start
        if not self.mapped:  # every receiver holds a mapping now: the names can go (shm), nothing to leak
            learner.unlink_segments()
            self.mapped = True
        self.version = version
        self.last = {
            "sync/bytes": float(manifest.nbytes),
            "sync/GBps": manifest.nbytes / max(seconds, 1e-9) / 1e9,
            "sync/version": float(version),
            "sync/send_s": manifest.send_seconds,
            "sync/receive_s": max(receive_seconds),
        }
        return version

    def push_in_calls(self, learner, engines: RestartingEngines, version: int | None = None) -> int:
        """The same weights in one send/receive call pair per bucket (with `bucket_mb=0`, per tensor): the
        protocol of a per-parameter weight update, which `relayrl bench sync` compares a push against."""
        version = self.version + 1 if version is None else version
        timeout, replicas = self.options.timeout_s, engines.replicas
        start = time.perf_counter()
        for bucket in range(len(self.layout.bucket_sizes)):
            if self.transport == "broadcast":
                sent = learner.submit("send_weights", version, [bucket])
                refs = [r.submit("receive_weights", Manifest(version, None, buckets=[bucket])) for r in replicas]
                learner.wait(sent, "sending weights", timeout)
            else:
                manifest = learner.wait(learner.submit("send_weights", version, [bucket]), "sending weights", timeout)
                refs = [r.submit("receive_weights", manifest) for r in replicas]
            for replica, ref in zip(replicas, refs):
                replica.wait(ref, "receiving weights", timeout)
        seconds = time.perf_counter() - start
        self.version = version
        self.last = {
            "sync/bytes": float(self.layout.nbytes),
            "sync/GBps": self.layout.nbytes / seconds / 1e9,
            "sync/version": float(version),
        }
        return version
