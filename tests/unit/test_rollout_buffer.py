"""The async buffer never hands out a sample staler than max_staleness; drop and wait do what they say; in drop
mode the producers stay at most one batch ahead of the learner."""

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.errors import PlacementError
from relayrl.schedules.buffer import Group, RolloutBuffer


def simulate(buffer: RolloutBuffer, actions, updates: int):
    """Producers admit groups (sampled with the engines' version then), finish them in any order and any
    delay; the learner takes a batch whenever one is ready and publishes the next version."""
    in_flight, version, handed_out = [], buffer.version, []
    for action, pick in actions:
        if action == "admit":
            try:
                ticket = buffer.admit(timeout_s=0)
            except PlacementError:
                continue
            in_flight.append((ticket, buffer.version))
        elif action == "finish" and in_flight:
            ticket, oldest = in_flight.pop(pick % len(in_flight))
            buffer.put(Group([], [], oldest=oldest, ticket=ticket))
        elif action == "learn":
            try:
                batch = buffer.take(version, timeout_s=0)
            except PlacementError:
                continue
            handed_out.append((version, [g.oldest for g in batch]))
            version += 1
            buffer.advance(version)
            if version >= updates:
                break
    return handed_out


actions = st.lists(
    st.tuples(st.sampled_from(["admit", "admit", "finish", "finish", "learn"]), st.integers(0, 1000)), max_size=400
)


@settings(max_examples=200, deadline=None)
@given(
    actions=actions,
    per_step=st.integers(1, 4),
    max_staleness=st.integers(0, 3),
    on_stale=st.sampled_from(["drop", "wait"]),
)
def test_no_handed_out_sample_is_staler_than_the_bound(actions, per_step, max_staleness, on_stale):
    buffer = RolloutBuffer(per_step, max_staleness, on_stale)
    for version, oldest in simulate(buffer, actions, updates=50):
        assert len(oldest) == per_step
        assert all(version - o <= max_staleness for o in oldest), (version, oldest)
    if on_stale == "wait":
        assert buffer.dropped == 0
    else:  # admitted and not yet taken or dropped, those being generated included: at most one batch
        assert buffer.admitted - buffer.released <= per_step


def test_drop_discards_stale_groups_and_counts_them():
    buffer = RolloutBuffer(groups_per_step=2, max_staleness=1, on_stale="drop", capacity=10)
    for oldest in (0, 0, 2, 3):
        buffer.put(Group([], [], oldest=oldest))
    batch = buffer.take(version=3, timeout_s=0)  # version 3: the two groups from version 0 are 3 behind
    assert [g.oldest for g in batch] == [2, 3]
    assert buffer.dropped == 2


def test_drop_producers_block_only_on_capacity():
    buffer = RolloutBuffer(groups_per_step=1, max_staleness=0, on_stale="drop", capacity=2)
    buffer.admit(0), buffer.put(Group([], [], oldest=0)), buffer.admit(0), buffer.put(Group([], [], oldest=0))
    with pytest.raises(PlacementError, match="room in the buffer"):
        buffer.admit(timeout_s=0)


def test_wait_producers_block_until_the_learner_publishes():
    buffer = RolloutBuffer(groups_per_step=2, max_staleness=1, on_stale="wait")
    tickets = [buffer.admit(0) for _ in range(4)]  # (0 + 1 + 1) * 2 groups may be in flight at version 0
    assert tickets == [0, 1, 2, 3]
    with pytest.raises(PlacementError):
        buffer.admit(timeout_s=0)
    released = []
    thread = threading.Thread(target=lambda: released.append(buffer.admit(timeout_s=5)))
    thread.start()
    time.sleep(0.1)
    assert not released  # still waiting
    buffer.advance(1)
    thread.join(5)
    assert released == [4]


def test_wait_takes_tickets_in_order_and_waits_for_a_straggler():
    buffer = RolloutBuffer(groups_per_step=2, max_staleness=1, on_stale="wait")
    for _ in range(3):
        buffer.admit(0)
    buffer.put(Group([], [], oldest=0, ticket=1))
    buffer.put(Group([], [], oldest=0, ticket=2))
    with pytest.raises(PlacementError, match="1 of 2|2 of 2"):
        buffer.take(version=0, timeout_s=0.05)  # ticket 0 is still generating
    buffer.put(Group([], [], oldest=0, ticket=0))
    assert [g.ticket for g in buffer.take(version=0, timeout_s=1)] == [0, 1]


def test_close_releases_waiting_producers_and_fails_the_learner():
    buffer = RolloutBuffer(groups_per_step=1, max_staleness=0, on_stale="wait")
    buffer.admit(0)
    results = []
    thread = threading.Thread(target=lambda: results.append(buffer.admit(timeout_s=5)))
    thread.start()
    buffer.close()
    thread.join(5)
    assert results == [None]
    with pytest.raises(PlacementError, match="stopped"):
        buffer.take(version=0, timeout_s=1)


def test_drop_producers_stay_one_batch_ahead_counting_the_groups_being_generated():
    """They used to count only the groups waiting in the buffer: producers ran batches ahead of the learner
    (the groups they were generating uncounted) and many of those groups were dropped as too stale."""
    buffer = RolloutBuffer(groups_per_step=2, max_staleness=1, on_stale="drop")
    assert [buffer.admit(0), buffer.admit(0)] == [0, 1]  # being generated, none put yet
    with pytest.raises(PlacementError, match="room in the buffer"):
        buffer.admit(timeout_s=0)
    assert buffer.admit_now() is None
    buffer.put(Group([], [], oldest=0)), buffer.put(Group([], [], oldest=0))
    with pytest.raises(PlacementError):  # waiting for the learner: still the next batch
        buffer.admit(timeout_s=0)
    buffer.take(version=0, timeout_s=0)
    assert [buffer.admit(0), buffer.admit_now(), buffer.admit_now()] == [2, 3, None]


def full_of_stale_groups() -> RolloutBuffer:
    """A drop-mode buffer at capacity (4 groups, from version 0) with a producer's next admit blocked."""
    buffer = RolloutBuffer(groups_per_step=2, max_staleness=1, on_stale="drop", capacity=4)
    for _ in range(4):
        buffer.admit(0)
        buffer.put(Group([], [], oldest=0))
    with pytest.raises(PlacementError, match="room in the buffer"):
        buffer.admit(timeout_s=0)
    return buffer


def test_publishing_drops_groups_that_can_no_longer_be_trained():
    buffer = full_of_stale_groups()
    buffer.advance(2)  # version 2 may use tokens of version 1 or newer: all four are useless now
    assert buffer.metrics() == {"buffer/groups": 0.0, "buffer/dropped": 4.0}
    assert buffer.admit(timeout_s=0) == 4


def test_a_take_that_drops_stale_groups_wakes_waiting_producers():
    """The stall of async partial rollouts: the learner dropped stale groups from a full buffer, found too few
    left for a batch and waited, while the producers slept on a buffer they believed full."""
    buffer = full_of_stale_groups()
    admitted = []
    producer = threading.Thread(target=lambda: admitted.append(buffer.admit(timeout_s=20)), daemon=True)
    producer.start()
    buffer.version = 2  # published without `advance` dropping anything: only the take can drop
    with pytest.raises(PlacementError, match="0 of 2 groups ready"):
        buffer.take(version=2, timeout_s=0)
    producer.join(20)
    assert admitted == [4]


def test_partial_state_discards_carried_finished_groups_too_old_to_train():
    from relayrl.schedules.modes import PartialState
    from relayrl.types import PartialSample, Prompt

    def sample(group, versions, finished):
        return PartialSample(
            prompt=Prompt(f"p{group}", "", [1]),
            group=group,
            group_index=0,
            seed=None,
            token_ids=[1] * len(versions),
            versions=versions,
            finish_reason="stop" if finished else None,
        )

    state = PartialState()
    state.ready = [[sample(0, [0, 1], True)], [sample(1, [1, 1], True)]]
    state.running = [sample(2, [0], False), sample(3, [1], False), sample(4, [], False)]
    assert sorted(state.discard_older_than(1)) == ["p0", "p2"]  # their prompts, settled in the async ledger
    assert [g[0].group for g in state.ready] == [1]
    assert [s.group for s in state.running] == [3, 4]
    assert state.discarded == 2
