"""`RayEngineGroup` against fake replicas (no Ray): the generate spans the timeline takes are recorded under the
lock `take_spans` holds, from the training loop (`finish`) and from producer threads (`generate_until`)."""

import pytest

from relayrl.config import PlacementConfig
from relayrl.errors import RoleFailure
from relayrl.placement.engines import RayEngineGroup
from relayrl.types import Sampling


class FakeReplica:
    def submit(self, method, *args):
        return args

    def wait(self, ref, what, timeout_s=None):
        return [], 1.0, 2.0  # generate_timed: (rollouts, start, end)

    def generate_until(self, samples, sampling, groups_needed):
        return samples


class GuardedSpans(list):
    """A span list that fails an append made without the group's span lock held."""

    def __init__(self, group):
        super().__init__()
        self.group = group

    def append(self, item):
        assert self.group.spans_lock.locked(), "span appended outside the lock take_spans uses"
        super().append(item)


def test_spans_are_recorded_under_the_lock_take_spans_uses():
    group = RayEngineGroup(lambda index: FakeReplica(), PlacementConfig(mode="ray", engines=2))
    group.spans = GuardedSpans(group)
    group.finish(group.submit([object(), object()], Sampling(), version=0))
    group.generate_until(1, [], Sampling(), groups_needed=0)
    spans = group.take_spans()
    assert [replica for replica, _, _ in spans] == [0, 1, 1]
    assert group.take_spans() == []


class DyingReplica(FakeReplica):
    """A replica whose calls fail the way a killed Ray actor's do."""

    def wait(self, ref, what, timeout_s=None):
        raise RoleFailure("engine 0 died during generate: killed by ray.kill", "engine 0", died=True)


def test_one_death_seen_by_two_callers_is_one_restart(monkeypatch):
    """The async producers and the sync can both see the same engine die; the second caller to recover must
    find the actor already replaced and retry on it, not spend a second restart (the soak's step-48 death)."""
    import sys
    import threading
    import types

    killed = []
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(kill=lambda actor, no_restart: killed.append(actor)))
    spawned = []

    def spawn(index):
        replica = DyingReplica() if not spawned else FakeReplica()
        replica._actor, replica.ping = len(spawned), lambda: None
        spawned.append(replica)
        return replica

    group = RayEngineGroup(
        spawn, PlacementConfig(mode="ray", engines=1, on_engine_failure="restart", max_engine_restarts=1)
    )
    dead, errors = group.replicas[0], []

    def caller():
        try:
            group.recover(0, RoleFailure("engine 0 died", "engine 0", died=True), seen=dead)
        except RoleFailure as error:
            errors.append(error)

    callers = [threading.Thread(target=caller) for _ in range(2)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(10)
    assert errors == []
    assert group.restarts == 1 and killed == [0] and len(spawned) == 2


def test_the_old_spelling_fail_is_read_as_stop_with_a_warning():
    from relayrl.config import load_config
    from relayrl.errors import ConfigWarning

    with pytest.warns(ConfigWarning, match=r"on_engine_failure=fail is now spelled stop"):
        config = load_config(None, ["placement.mode=ray", "placement.on_engine_failure=fail"])
    assert config.placement.on_engine_failure == "stop"
