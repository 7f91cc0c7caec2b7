"""Bucketing, checksums and the transports that run without Ray (shm, disk), sender and receiver in one process."""

import pytest
import torch

from relayrl.errors import SyncError
from relayrl.sync.buckets import checksum, layout_of, make_layout, pack, unpack
from relayrl.sync.transports import make_receiver, make_sender


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(50, 8, generator=g)),
        ("layer.0.w", torch.randn(8, 8, generator=g)),
        ("layer.0.b", torch.randn(8, generator=g)),
        ("head.weight", torch.randn(8, 50, generator=g)),
    ]


def test_layout_greedy_buckets_and_oversized_tensor():
    # 1 KiB buckets of fp32 = 256 elements: 400 alone (oversized), 64 + 8 together, 400 alone
    layout = make_layout(
        [("a", (50, 8)), ("b", (8, 8)), ("c", (8,)), ("d", (8, 50))], bucket_mb=1 / 1024, wire_dtype="fp32"
    )
    assert layout.bucket_sizes == (400, 72, 400)
    assert [s.bucket for s in layout.slots] == [0, 1, 1, 2]
    assert [s.offset for s in layout.slots] == [0, 0, 64, 0]


def test_per_tensor_layout_has_one_bucket_each():
    layout = layout_of(weights(), bucket_mb=0, wire_dtype="fp32")
    assert len(layout.bucket_sizes) == 4


@pytest.mark.parametrize("wire", ["fp32", "bf16"])
def test_pack_unpack_round_trip(wire):
    named = weights()
    layout = layout_of(named, bucket_mb=1, wire_dtype=wire)
    buckets = layout.empty_buckets()
    pack(named, layout, buckets)
    out = dict(unpack(layout, buckets))
    for name, tensor in named:
        expected = tensor if wire == "fp32" else tensor.to(torch.bfloat16)
        assert torch.equal(out[name], expected), name
    assert layout.nbytes == sum(t.numel() for _, t in named) * (4 if wire == "fp32" else 2)


def test_pack_rejects_a_changed_shape():
    named = weights()
    layout = layout_of(named, 1, "fp32")
    with pytest.raises(SyncError, match="layer.0.w"):
        pack([("layer.0.w", torch.zeros(9, 8))], layout, layout.empty_buckets())


@pytest.mark.parametrize("kind", ["shm", "disk"])
def test_transport_delivers_every_version(kind, tmp_path):
    layout = layout_of(weights(), bucket_mb=0.001, wire_dtype="fp32")
    sender = make_sender(kind, layout, directory=str(tmp_path))
    receiver = make_receiver(kind, layout)
    try:
        for version in (1, 2):
            manifest = sender.send(weights(seed=version), version)
            got = dict(receiver.receive(manifest))
            for name, tensor in weights(seed=version):
                assert torch.equal(got[name], tensor)
            assert manifest.version == version and len(manifest.checksums) == len(layout.bucket_sizes)
    finally:
        sender.close()


def test_shm_buffers_are_reused_across_pushes():
    layout = layout_of(weights(), 1, "fp32")
    sender = make_sender("shm", layout)
    try:
        first = sender.send(weights(1), 1).handle
        assert sender.send(weights(2), 2).handle == first
    finally:
        sender.close()


@pytest.mark.parametrize("kind", ["shm", "disk"])
def test_a_corrupted_bucket_is_detected_by_its_checksum(kind, tmp_path):
    layout = layout_of(weights(), bucket_mb=0.001, wire_dtype="fp32")
    sender = make_sender(kind, layout, directory=str(tmp_path))
    receiver = make_receiver(kind, layout)
    try:
        manifest = sender.send(weights(), 7)
        if kind == "shm":
            sender.buckets[1][3] += 1.0  # flips bytes in the shared segment after the checksum was taken
        else:
            manifest.checksums[1] ^= 1  # equivalent: what arrived does not match what the sender hashed
        with pytest.raises(SyncError, match=r"bucket 1 of policy version 7 is corrupt.*layer\.0\.w"):
            receiver.receive(manifest)
    finally:
        sender.close()


def test_shm_receiver_names_a_missing_segment():
    layout = layout_of(weights(), 1, "fp32")
    sender = make_sender("shm", layout)
    manifest = sender.send(weights(), 1)
    sender.close()
    with pytest.raises(SyncError, match="does not exist"):
        make_receiver("shm", layout).receive(manifest)


def test_checksum_changes_with_one_bit():
    t = torch.zeros(1000)
    before = checksum(t)
    t.view(torch.int32)[500] ^= 1
    assert checksum(t) != before


def test_adopted_parameters_live_in_shared_memory_and_push_without_a_copy():
    params = [(name, torch.nn.Parameter(t.clone())) for name, t in weights()]
    layout = layout_of(params, bucket_mb=1, wire_dtype="fp32")
    sender = make_sender("shm", layout)
    receiver = make_receiver("shm", layout)
    try:
        assert sender.adopt(params) == len(params)
        slot = layout.slots[1]
        assert params[1][1].data_ptr() == sender.buckets[slot.bucket][slot.offset :].data_ptr()
        with torch.no_grad():
            params[1][1].add_(1.0)  # an optimizer step writes straight into the segment
        got = dict(receiver.receive(sender.send(params, 1)))
        for name, param in params:
            assert torch.equal(got[name], param.detach())
    finally:
        sender.close()


@pytest.mark.parametrize("kind", ["shm", "disk"])
def test_one_bucket_per_call_delivers_just_that_bucket(kind, tmp_path):
    layout = layout_of(weights(), bucket_mb=0, wire_dtype="fp32")  # one bucket per tensor
    sender = make_sender(kind, layout, directory=str(tmp_path))
    receiver = make_receiver(kind, layout)
    try:
        named = weights(seed=3)
        manifest = sender.send(named, 5, only=[2])
        assert manifest.buckets == [2] and len(manifest.checksums) == 1
        assert manifest.nbytes == named[2][1].numel() * 4
        got = dict(receiver.receive(manifest))
        assert list(got) == ["layer.0.b"] and torch.equal(got["layer.0.b"], named[2][1])
        if kind == "shm":
            sender.buckets[2][0] += 1.0
            with pytest.raises(SyncError, match="bucket 2 of policy version 5"):
                receiver.receive(manifest)
    finally:
        sender.close()


def test_bench_model_size_follows_params_below_the_vocabulary():
    from relayrl.placement.sync_bench import synthetic_shapes

    def total(shapes):
        return sum(torch.Size(shape).numel() for _, shape in shapes)

    small = synthetic_shapes(int(2e7))  # SmolLM's vocabulary alone is 57M: it must shrink, not win
    assert 0.8 * 2e7 <= total(small) <= 1.2 * 2e7
    assert sum(name.endswith("q_proj.weight") for name, _ in small) >= 2  # still layers, not only embeddings
    assert dict(synthetic_shapes(int(1e8)))["model.embed_tokens.weight"] == (49_152, 576)  # unchanged above


def test_sync_metrics_name_their_unit_gigabytes_per_second():
    from types import SimpleNamespace

    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sync.inprocess import InProcessSync

    learner = SimpleNamespace(named_weights=lambda: iter(weights()))
    engine = SimpleNamespace(load_weights=lambda named, version: list(named))
    sync = InProcessSync()
    sync.push(learner, LocalEngineGroup(engine))
    nbytes = sum(t.numel() * 4 for _, t in weights())
    assert sync.last["sync/bytes"] == nbytes and "sync/gbps" not in sync.last
    assert sync.last["sync/GBps"] > 0  # bytes / seconds / 1e9


def test_shm_segments_are_named_by_owner_and_creator_and_can_lose_their_names_early():
    import os
    from pathlib import Path

    layout = layout_of(weights(), bucket_mb=0.001, wire_dtype="fp32")
    sender = make_sender("shm", layout, owner=os.getppid())
    receiver = make_receiver("shm", layout)
    try:
        assert Path(sender.prefix).name.startswith(f"relayrl_{os.getppid()}_{os.getpid()}_")
        receiver.receive(sender.send(weights(seed=1), 1))  # the receiver maps every segment
        sender.unlink()
        assert not list(Path("/dev/shm").glob(Path(sender.prefix).name + "-*"))
        got = dict(receiver.receive(sender.send(weights(seed=2), 2)))  # mappings outlive the names
        for name, tensor in weights(seed=2):
            assert torch.equal(got[name], tensor)
    finally:
        sender.close()


def test_sweep_removes_segments_whose_owner_or_creator_is_dead(tmp_path):
    import os
    import subprocess
    import sys

    from relayrl.sync.segments import sweep_segments

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    live = str(os.getpid())
    names = {
        f"relayrl_{dead}_{live}_ab12cd34-0": False,
        f"relayrl_{live}_{dead}_ab12cd34-0": False,
        f"relayrl-{dead}-ab12cd34-3": False,
        f"relayrl_{live}_{live}_ab12cd34-0": True,
        "relayrl-notes.txt": True,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = sweep_segments(tmp_path)
    assert sorted(removed) == sorted(n for n, keep in names.items() if not keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, keep in names.items() if keep)


def broadcast_pair(world=2):
    """A sender's and a receiver's end of a real gloo weight-sync group, both in this process."""
    from concurrent.futures import ThreadPoolExecutor

    from relayrl.sync.group import join_group
    from relayrl.sync.remote import free_port

    port = free_port()
    with ThreadPoolExecutor(world) as pool:
        ends = [pool.submit(join_group, "127.0.0.1", port, rank, world, 30.0) for rank in range(world)]
        return [end.result(60) for end in ends]


@pytest.mark.parametrize("wire", ["fp32", "bf16"])
@pytest.mark.parametrize("streaming", [False, True])
def test_a_broadcast_over_gloo_delivers_every_tensor(wire, streaming):
    """The actor's end (every bucket, then verified) and a vLLM worker's end (each bucket as it arrives, verified,
    with no buffer for the whole model), in both wire dtypes (bf16 buckets went as int16, which gloo refuses)."""
    from concurrent.futures import ThreadPoolExecutor

    from relayrl.sync.transports import Manifest, StreamingBroadcastReceiver

    learner, worker = broadcast_pair()
    layout = layout_of(weights(), bucket_mb=0.001, wire_dtype=wire)
    assert len(layout.bucket_sizes) >= 2
    sender = make_sender("broadcast", layout, True, learner, 30.0)
    if streaming:
        receiver = StreamingBroadcastReceiver(layout, True, worker, 30.0)
    else:
        receiver = make_receiver("broadcast", layout, True, worker, 30.0)
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(sender.send, weights(), 4)
        got = [(name, tensor.clone()) for name, tensor in receiver.receive(Manifest(4, None))]
        sent.result(60)
    assert [n for n, _ in got] == [n for n, _ in weights()]
    for (_, a), (_, b) in zip(got, weights()):
        torch.testing.assert_close(a.float(), b.to(layout.dtype).float())


def test_a_streaming_receiver_names_a_corrupt_bucket_before_yielding_its_tensors():
    from concurrent.futures import ThreadPoolExecutor

    from relayrl.sync.transports import BroadcastSender, Manifest, StreamingBroadcastReceiver

    class Corrupting(BroadcastSender):  # bucket 1 arrives other than the sender hashed it, as on a bad link
        def checksum_of(self, index, bucket):
            return checksum(bucket) ^ (index == 1)

    learner, worker = broadcast_pair()
    layout = layout_of(weights(), bucket_mb=0.001, wire_dtype="fp32")
    sender = Corrupting(layout, True, learner, 30.0)
    stream = StreamingBroadcastReceiver(layout, True, worker, 30.0).receive(Manifest(2, None))
    yielded = []
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(sender.send, weights(), 2)
        with pytest.raises(SyncError, match=r"bucket 1 of policy version 2 is corrupt.*layer\.0\.w"):
            for name, _ in stream:
                yielded.append(name)
        sent.result(60)
    # bucket 0 was good; nothing of bucket 1 or after; the sender's broadcast completed
    assert yielded == [s.name for s in layout.bucket_slots(0)] and len(layout.bucket_sizes) > 2


def test_the_wire_dtype_follows_the_engines_dtype(random_model_dir):
    """`sync.wire_dtype: auto`: bf16 where the engine serves bf16 (a GPU), fp32 for an fp16 or fp32 engine (this CPU),
    the reason in the dump; an explicit choice stays."""
    from relayrl.build import resolve
    from relayrl.config import dump_config, load_config
    from relayrl.sync.buckets import resolve_wire_dtype

    config = resolve(load_config(None, [f"model.path={random_model_dir}"]))
    assert config.sync.wire_dtype == "fp32"  # this CPU: the engine serves float32
    assert "auto chose fp32: the engine serves float32" in dump_config(config)
    for engine, wire in [("bfloat16", "bf16"), ("float16", "fp32")]:
        config.sync.wire_dtype = "auto"
        config.choose("sync.wire_dtype", *resolve_wire_dtype(config.rollout.dtype, engine))
        assert config.sync.wire_dtype == wire
    assert (
        resolve(load_config(None, [f"model.path={random_model_dir}", "sync.wire_dtype=bf16"])).sync.wire_dtype == "bf16"
    )


class _Gathered:
    """A sharded parameter's stand-in: `full_tensor()` (FSDP2's all-gather) returns the whole tensor, counted."""

    def __init__(self, tensor, gathers):
        self.tensor, self.gathers = tensor, gathers

    def full_tensor(self):
        self.gathers.append(1)
        return self.tensor


class _Shards:
    def __init__(self, named, gathers):
        self.named, self.gathers = named, gathers

    def reshard(self):
        pass

    def named_parameters(self):
        return [(name, _Gathered(t, self.gathers)) for name, t in self.named]


@pytest.mark.parametrize("checks", [True, False])
def test_a_sharded_broadcast_push_gathers_each_bucket_once_with_todays_checksums(checks):
    """The checksums travel after each bucket: every rank all-gathers each parameter once per push (twice before,
    checksums on: a header of every bucket's sum came first), and the sums are those of the packed buckets, as a
    whole-model push computes them; the engine's end receives every tensor verified."""
    from concurrent.futures import ThreadPoolExecutor

    from relayrl.sync.gather import SyncPlan, send_from_shards, streaming_sender
    from relayrl.sync.transports import Manifest, StreamingBroadcastReceiver

    named = list(weights())
    layout = layout_of(named, bucket_mb=0.0005, wire_dtype="bf16")
    assert len(layout.bucket_sizes) > 2
    learner, worker = broadcast_pair()
    sender = streaming_sender("broadcast", layout, checks, learner, 30.0, None, None)
    rank0, other = [], []
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(send_from_shards, _Shards(named, rank0), layout, SyncPlan("broadcast", checks), sender, 7)
        got = [
            (n, t.clone())
            for n, t in StreamingBroadcastReceiver(layout, checks, worker, 30.0).receive(Manifest(7, None))
        ]
        manifest = sent.result(60)
    assert send_from_shards(_Shards(named, other), layout, SyncPlan("broadcast", checks), None, 7) is None
    assert len(rank0) == len(other) == len(named)  # one all-gather per parameter, on every rank
    whole = layout.empty_buckets()
    pack(named, layout, whole)
    assert manifest.checksums == ([checksum(b) for b in whole] if checks else None)
    assert [n for n, _ in got] == [n for n, _ in named]
    for (_, a), (_, b) in zip(got, named):
        assert torch.equal(a, b.to(torch.bfloat16))
