"""`EngineGroup` against fake replicas (no Ray): the generate spans the timeline takes are recorded under the
lock `take_spans` holds, from the training loop (`finish`) and from producer threads (`generate_until`)."""

from relayrl.config import PlacementConfig
from relayrl.placement.engines import EngineGroup
from relayrl.rollout.base import Sampling


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
    group = EngineGroup(lambda index: FakeReplica(), PlacementConfig(mode="ray", engines=2))
    group.spans = GuardedSpans(group)
    group.finish(group.submit([object(), object()], Sampling(), version=0))
    group.generate_until(1, [], Sampling(), groups_needed=0)
    spans = group.take_spans()
    assert [replica for replica, _, _ in spans] == [0, 1, 1]
    assert group.take_spans() == []
