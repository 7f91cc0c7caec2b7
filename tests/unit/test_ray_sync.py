"""`RaySync` driven against in-process fakes of the learner and engine roles (no Ray): which version each
replica is told it holds, and when the shared-memory segments stop having names."""

from types import SimpleNamespace

from relayrl.config import SyncConfig
from relayrl.errors import RoleFailure
from relayrl.sync.remote import RaySync
from relayrl.sync.transports import Manifest


class FakeRole:
    """`submit` defers the call, `wait` runs it: the two halves of a RemoteRole."""

    def __init__(self, target):
        self.target = target

    def submit(self, method, *args):
        return lambda: getattr(self.target, method)(*args)

    def wait(self, ref, what, timeout_s=None):
        return ref()

    def __getattr__(self, method):
        return lambda *args: getattr(self.target, method)(*args)


class Learner:
    def __init__(self):
        self.unlinked = 0

    def weight_layout(self, bucket_mb, wire_dtype):
        return SimpleNamespace(bucket_sizes=[2], nbytes=8, slots=[])

    def open_sender(self, *args):
        return 0

    def send_weights(self, version, only=None):
        return Manifest(version, None, "segments", nbytes=8)

    def unlink_segments(self):
        self.unlinked += 1


class Engine:
    def __init__(self, fail_first_receive=False):
        self.fail = fail_first_receive
        self.loaded: list[int] = []

    def open_receiver(self, *args):
        pass

    def receive_weights(self, manifest):
        if self.fail:
            self.fail = False
            raise RoleFailure("engine 0 (actor x) died during receiving weights", "engine 0", died=True)
        self.loaded.append(manifest.version)
        return 0.0


class Engines:
    """An EngineGroup's restart protocol: replace the replica, then let the sync re-attach and re-push."""

    def __init__(self, engines):
        self.replicas = [FakeRole(e) for e in engines]
        self.on_restart = lambda: None
        self.restarted: list[Engine] = []

    def recover(self, index, failure, seen=None):
        fresh = Engine()
        self.restarted.append(fresh)
        self.replicas[index] = FakeRole(fresh)
        self.on_restart()


def test_a_restart_during_a_push_re_pushes_the_new_version():
    survivor = Engine()
    engines = Engines([Engine(fail_first_receive=True), survivor])
    learner = FakeRole(Learner())
    sync = RaySync(SyncConfig(), "shm")
    sync.setup(learner, engines)
    assert sync.push(learner, engines) == 1
    fresh = engines.restarted[0]
    assert fresh.loaded == [1]  # the restarted replica holds the weights of version 1, labelled 1
    assert set(survivor.loaded) == {1}  # every copy the survivor got is labelled with the weights' version
    assert sync.version == 1
    sync.push(learner, engines)
    assert fresh.loaded == [1, 2] and survivor.loaded[-1] == 2


def test_segment_names_go_once_every_receiver_has_mapped_them():
    engines = Engines([Engine(), Engine()])
    learner = Learner()
    sync = RaySync(SyncConfig(), "shm")
    sync.setup(FakeRole(learner), engines)
    assert learner.unlinked == 0
    sync.push(FakeRole(learner), engines)
    assert learner.unlinked == 1  # after the first push every replica holds a mapping
    sync.push(FakeRole(learner), engines)
    assert learner.unlinked == 1
    engines.recover(0, RoleFailure("engine 0 died", "engine 0", died=True))  # a new sender, new segments
    assert learner.unlinked == 2


def test_a_restart_between_pushes_re_pushes_the_current_version():
    engines = Engines([Engine()])
    learner = FakeRole(Learner())
    sync = RaySync(SyncConfig(), "shm")
    sync.setup(learner, engines)
    sync.push(learner, engines)
    sync.push(learner, engines)
    engines.recover(0, RoleFailure("engine 0 died", "engine 0", died=True))
    assert engines.restarted[0].loaded == [2]


class GroupMember:
    """An end of the broadcast group that records where it joined; `ranks` is how many members it holds."""

    def __init__(self, ranks=1):
        self.ranks, self.joined = ranks, None

    def __ray_call__(self, fn):  # node_address, run in the learner's actor
        return "10.0.0.1", 1234

    def weight_layout(self, bucket_mb, wire_dtype):
        return SimpleNamespace(bucket_sizes=[2], nbytes=8, slots=[])

    def sync_ranks(self):
        return self.ranks

    def join_sync_group(self, address, port, *rank_and_world):
        self.joined = (address, port, *rank_and_world)

    def open_sender(self, *args):
        return 0

    def open_receiver(self, *args):
        pass


def test_broadcast_ranks_count_every_engine_worker():
    """A vLLM engine whose T workers receive the push holds T ranks of the group: ranks follow one another and
    the world counts them all (the learner is rank 0)."""
    learner, members = GroupMember(), [GroupMember(2), GroupMember(1), GroupMember(2)]
    engines = Engines([])
    engines.replicas = [FakeRole(m) for m in members]
    RaySync(SyncConfig(), "broadcast").setup(FakeRole(learner), engines)
    assert learner.joined == ("10.0.0.1", 1234, 6, SyncConfig().timeout_s)
    assert [m.joined[2:4] for m in members] == [(1, 6), (3, 6), (4, 6)]


class RecordingEngine:
    """The engine-side calls an EngineWorker makes: a vLLM engine without adapters receives in its workers."""

    def __init__(self, in_workers: bool, tensor_parallel=2):
        self.receives_in_workers, self.tensor_parallel = in_workers, tensor_parallel
        self.calls: list[tuple] = []

    def join_weight_group(self, *args):
        self.calls.append(("join", *args))

    def open_weight_receivers(self, *args):
        self.calls.append(("open", *args))

    def receive_broadcast(self, version, buckets=None):
        self.calls.append(("receive", version, buckets))

    def load_weights(self, named, version):
        self.calls.append(("load", [n for n, _ in named], version))


def worker_with(engine):
    from relayrl.placement.engine_worker import EngineWorker

    worker = EngineWorker.__new__(EngineWorker)  # the actor's state without starting an engine
    worker.engine = engine
    return worker


def test_an_engine_worker_hands_a_broadcast_to_the_engines_workers():
    engine = RecordingEngine(in_workers=True)
    worker = worker_with(engine)
    assert worker.sync_ranks() == 2
    worker.join_sync_group("10.0.0.1", 1234, 3, 6, 9.0)
    worker.open_receiver("broadcast", "layout", True, 9.0)
    worker.receive_weights(Manifest(4, None, buckets=[1]))
    from relayrl.sync.transports import WorkerMembership

    assert engine.calls == [
        ("join", WorkerMembership("10.0.0.1", 1234, 3, 6, 9.0)),
        ("open", "layout", True),
        ("receive", 4, [1]),
    ]
    assert worker.receiver is None and worker.sync_group is None  # nothing received in the actor itself


def test_other_transports_and_engines_receive_in_the_actor():
    import torch

    from relayrl.sync.buckets import layout_of

    named = [("w", torch.ones(3))]
    layout = layout_of(named, 1.0, "fp32")
    for engine, transport in [(RecordingEngine(in_workers=True), "object_store"), (RecordingEngine(False), "disk")]:
        worker = worker_with(engine)
        worker.open_receiver(transport, layout, True, 9.0)
        assert worker.receiver is not None and not worker.in_workers
    assert worker_with(RecordingEngine(in_workers=False)).sync_ranks() == 1
