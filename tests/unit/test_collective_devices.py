"""Collectives on the group's device: every tensor relayrl hands the learner group or a weight-sync group is made on
that group's device (CUDA under NCCL, CPU under gloo), headers and scalars included, and the groups refuse any other;
a group whose members would use different backends is refused at join, naming them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from relayrl.errors import PlacementError, SyncError
from relayrl.learner.process_group import all_reduce, group_device
from relayrl.sync.group import SyncGroup, check_backends

ROOT = Path(__file__).resolve().parents[2] / "relayrl"
COLLECTIVE_CALLS = {"_broadcast", "all_reduce", "broadcast", "all_gather", "reduce_scatter"}
MAKERS = {"tensor", "zeros", "empty", "ones", "full"}


class _Recording:
    """A process group that records what it is handed (and completes at once)."""

    def __init__(self):
        self.devices = []

    def broadcast(self, tensors, options):
        self.devices += [t.device for t in tensors]
        return type("Done", (), {"wait": lambda self, timeout: True})()


def test_the_sync_group_refuses_a_tensor_off_its_device():
    group = SyncGroup(_Recording(), "nccl", torch.device("meta"))  # stands for cuda:0 on this CPU machine
    with pytest.raises(SyncError, match=r"a \(3,\) tensor on cpu was handed to the weight-sync group, whose nccl "):
        group.broadcast(torch.zeros(3), timeout_s=1)
    group.broadcast(torch.zeros(3, device="meta"), timeout_s=1)
    assert group.group.devices == [torch.device("meta")]


def test_a_broadcast_push_makes_its_header_and_buckets_on_the_groups_device():
    from relayrl.sync.buckets import make_layout
    from relayrl.sync.transports import BroadcastReceiver, BroadcastSender, Manifest

    layout = make_layout([("a", (4,)), ("b", (2, 3))], bucket_mb=64, wire_dtype="fp32")
    group = SyncGroup(_Recording(), "nccl", torch.device("meta"))
    sender = BroadcastSender(layout, False, group, timeout_s=1)
    assert {b.device for b in sender.buckets} == {torch.device("meta")}
    sender.stream(3, [0], lambda i: sender.buckets[i])  # the version, then the bucket
    receiver = BroadcastReceiver(layout, False, group, timeout_s=1)
    with pytest.raises(RuntimeError, match="meta"):  # meta tensors carry no values to read the version from
        list(receiver.receive(Manifest(3, None)))
    assert set(group.group.devices) == {torch.device("meta")} and len(group.group.devices) == 3


def test_an_nccl_push_skips_checksums_on_both_ends_and_says_so(caplog):
    """Under NCCL a host hash would copy every bucket off the GPU on the learner and on every worker: both ends
    turn checksums off alike (one backend per group) and the sender's log says why; gloo keeps them."""
    from relayrl.sync.buckets import make_layout
    from relayrl.sync.transports import BroadcastReceiver, BroadcastSender, StreamingBroadcastReceiver

    layout = make_layout([("a", (4,))], bucket_mb=64, wire_dtype="fp32")
    nccl = SyncGroup(_Recording(), "nccl", torch.device("meta"))
    with caplog.at_level("INFO", logger="relayrl.sync.transports"):
        sender = BroadcastSender(layout, True, nccl, timeout_s=1)
    assert "sync.checksum is off for this push: NCCL" in caplog.text
    ends = [sender, BroadcastReceiver(layout, True, nccl, 1), StreamingBroadcastReceiver(layout, True, nccl, 1)]
    assert [end.verify_checksums for end in ends] == [False, False, False]
    assert sender.stream(3, [0], lambda i: sender.buckets[i]) is None and len(nccl.group.devices) == 2  # no trailer
    gloo = SyncGroup(_Recording(), "gloo", torch.device("meta"))
    assert BroadcastSender(layout, True, gloo, timeout_s=1).verify_checksums


def test_the_learner_group_refuses_a_tensor_off_its_device():
    assert group_device() == torch.device("cpu")  # no NCCL group in this process
    with pytest.raises(PlacementError, match="a tensor on meta was handed to the learner group, whose collectives"):
        all_reduce(torch.zeros(1, device="meta"))


def test_members_with_different_backends_are_refused_at_join_naming_both():
    store = torch.distributed.HashStore()
    store.set("relayrl/backend/0", "nccl")  # rank 0 (the learner) sees a GPU
    with pytest.raises(SyncError, match=r"weight-sync group mixes collective backends \(rank 0: nccl, rank 1: gloo\)"):
        check_backends(store, 1, 2, "gloo", "the weight-sync group")
    agreed = torch.distributed.HashStore()
    agreed.set("relayrl/backend/0", "gloo")
    check_backends(agreed, 1, 2, "gloo", "the weight-sync group")


def _collective_functions():
    for path in [*(ROOT / "sync").glob("*.py"), *(ROOT / "learner").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
                names = {c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "") for c in calls}
                if names & COLLECTIVE_CALLS:
                    yield path, node, calls


def test_every_tensor_made_where_a_collective_runs_names_its_device():
    """Statically: in every function that calls a collective, each torch.tensor/zeros/empty/... passes `device=`
    (on CPU every default is the gloo device, so only this catches a CPU tensor meant for NCCL)."""
    missing = []
    for path, function, calls in _collective_functions():
        for call in calls:
            func = call.func
            made = isinstance(func, ast.Attribute) and func.attr in MAKERS and ast.unparse(func.value) == "torch"
            if made and not any(k.arg == "device" for k in call.keywords):
                missing.append(f"{path.relative_to(ROOT.parent)}:{call.lineno} in {function.name}()")
    assert missing == [], "tensors made for a collective without a device:\n  " + "\n  ".join(missing)
