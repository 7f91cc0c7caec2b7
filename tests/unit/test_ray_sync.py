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
        return SimpleNamespace(bucket_sizes=[2], nbytes=8)

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
