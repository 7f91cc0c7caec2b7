"""Placement across nodes and the blame for a hung learner rank, without a cluster: the bundles carry the
roles' custom resources, a resource no node has is refused at once, a transport that cannot cross nodes is
refused naming the roles and their nodes, and a missed deadline names the rank outside a collective.
(tests/e2e/test_multinode.py runs all of it on a Ray test cluster of two nodes.)"""

from pathlib import Path

import pytest

from relayrl.config import PlacementConfig, effective_transport, load_config
from relayrl.errors import PlacementError
from relayrl.placement.cluster import check_fits, check_transport_nodes, plan_slots
from relayrl.placement.learner_ranks import blame

PINNED = ["placement.learner_resources={learner_node: 1}", "placement.engine_resources={engine_node: 1}"]
HEAD, OTHER = "node aaaaaaaaaaaa (10.0.0.1)", "node bbbbbbbbbbbb (10.0.0.2)"


def config(*extra):
    return load_config(None, ["placement.mode=ray", "placement.engines=2", *PINNED, *extra])


def test_bundles_carry_the_roles_resources():
    placement = config().placement
    bundles, slots = plan_slots(placement, 4)
    assert bundles == [{"CPU": 1.0, "learner_node": 1.0}] + [{"CPU": 1.0, "engine_node": 1.0}] * 2
    colocated, _ = plan_slots(placement.model_copy(update={"layout": "colocated"}), 4)
    assert colocated == [{"CPU": 1.0, "engine_node": 1.0, "learner_node": 1.0}]
    assert [s.bundle for s in slots] == [0, 1, 2]


def test_a_resource_no_node_has_is_refused_at_once():
    placement = config().placement
    bundles, _ = plan_slots(placement, 4)
    total = {"CPU": 8.0, "learner_node": 1.0, "engine_node": 1.0, "node:10.0.0.1": 1.0, "memory": 1e9}
    with pytest.raises(PlacementError, match=r"placement.engine_resources asks for engine_node: 2 in all, but the"):
        check_fits(placement, bundles, total, total)
    check_fits(placement, bundles, {**total, "engine_node": 2.0}, total)
    del total["engine_node"]
    with pytest.raises(PlacementError, match=r"its custom resources: learner_node\)"):
        check_fits(placement, bundles, total, total)
    plain = PlacementConfig(mode="ray")
    check_fits(plain, plan_slots(plain, 4)[0], total, total)  # no resource asked for: none checked


@pytest.mark.parametrize("transport", ["shm", "disk"])
def test_a_transport_that_cannot_cross_nodes_is_refused_naming_roles_and_nodes(transport):
    cfg = config(f"sync.transport={transport}")
    _, slots = plan_slots(cfg.placement, 4)
    with pytest.raises(PlacementError) as refused:
        check_transport_nodes(cfg.sync, slots, {0: HEAD, 1: HEAD, 2: OTHER})
    message = str(refused.value)
    assert f"learner on {HEAD}; engine 1 on {OTHER}." in message
    assert "engine 0" not in message  # it shares the learner's node
    check_transport_nodes(cfg.sync, slots, {0: OTHER, 1: OTHER, 2: OTHER})  # one node: anything goes


def test_auto_is_shared_memory_on_one_node_and_broadcast_across_nodes(capsys):
    one, across = config(), config()
    _, slots = plan_slots(one.placement, 4)
    check_transport_nodes(one.sync, slots, {0: HEAD, 1: HEAD, 2: HEAD})
    check_transport_nodes(across.sync, slots, {0: HEAD, 1: HEAD, 2: OTHER})
    assert effective_transport(one) == "shm" and effective_transport(across) == "broadcast"
    assert (
        f"sync.transport=auto is broadcast: engines on other nodes than the learner's ({HEAD})"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize("extra", ["sync.transport=broadcast", "sync.transport=object_store", "sync.directory=/nfs"])
def test_transports_that_cross_nodes_pass(extra, tmp_path):
    cfg = config("sync.transport=disk", extra) if extra.startswith("sync.directory") else config(extra)
    _, slots = plan_slots(cfg.placement, 4)
    check_transport_nodes(cfg.sync, slots, {0: HEAD, 1: OTHER, 2: OTHER})


COLLECTIVE = "/venv/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:300 in wait_for_unshard: work.wait()"
STACK_0 = ["/relayrl/learner/policy.py:80 in update: loss.backward()", COLLECTIVE]
STACK_1 = [
    "/relayrl/learner/policy.py:70 in forward: out = self.model(ids)",
    "/venv/torch/nn/modules/module.py:1780 in _call_impl: return forward_call(*args)",
    "/user/faults.py:12 in hang: time.sleep(600)",
    "/venv/torch/utils/_contextlib.py:116 in decorate: return fn()",
]
NAMES = {0: "learner rank 0 (actor a0)", 1: "learner rank 1 (actor a1)", 2: "learner rank 2 (actor a2)"}
LATE = "did not finish update within 8 s (placement.call_timeout_s)"


def test_the_rank_outside_a_collective_is_blamed_not_its_waiting_peers():
    failure = blame({0: STACK_0, 1: STACK_1, 2: STACK_0}, {}, LATE, NAMES)
    assert failure.role == "learner rank 1" and not failure.died
    assert str(failure) == (
        f"learner rank 1 (actor a1) {LATE}: it hangs at /user/faults.py:12 in hang: time.sleep(600); "
        "learner ranks 0, 2 wait for it in a collective"
    )


def test_a_rank_that_cannot_answer_is_blamed_and_a_failed_collective_is_the_cause_when_all_wait():
    silent = blame({0: STACK_0, 1: None}, {}, LATE, NAMES)
    assert str(silent).startswith("learner rank 1 (actor a1) did not finish update within 8 s")
    assert "did not say where it is within 5 s" in str(silent)
    held = {1: "learner rank 1 (actor a1) raised during update: RuntimeError: Connection closed by peer"}
    failed = blame({0: STACK_0}, held, LATE, NAMES)
    assert failed.role == "learner rank 1" and str(failed).endswith("learner ranks 0 still wait in a collective")
    assert "its call's thread was not found" in str(blame({0: STACK_0, 1: []}, {}, LATE, NAMES))
    stuck = blame({0: STACK_0, 1: STACK_0}, {}, LATE, NAMES)  # a mismatched collective: nobody to single out
    assert stuck.role == "learner rank 0" and str(stuck).count("it waits in a collective at") == 2


def test_no_address_is_hard_coded_to_loopback():
    """The sync and placement paths reach other nodes; only the run's private head (ray_head.py) is loopback."""
    root = Path(__file__).parents[2] / "relayrl"
    found = [
        str(path.relative_to(root))
        for folder in ("sync", "placement", "learner")
        for path in (root / folder).glob("*.py")
        if path.name != "ray_head.py" and ("127.0.0.1" in path.read_text() or "localhost" in path.read_text())
    ]
    assert not found


def test_colocated_across_nodes_is_refused_where_auto_would_broadcast_onto_the_senders_gpu():
    """Two nodes of one GPU each, colocated: auto turns to broadcast (engine 1 is on the other node), whose group
    would hold learner rank 0 and engine 0 on GPU 0 of the first node."""
    from relayrl.config import SyncConfig
    from relayrl.placement.cluster import check_broadcast_devices

    placement = load_config(
        None, ["placement.mode=ray", "placement.layout=colocated", "placement.learner_ranks=2", "placement.engines=2"]
    ).placement
    _, slots = plan_slots(placement, 4, gpus=True)
    nodes = {0: HEAD, 1: OTHER}
    sync = SyncConfig()
    check_transport_nodes(sync, slots, nodes)
    assert sync.transport == "broadcast"
    with pytest.raises(PlacementError) as refused:
        check_broadcast_devices(sync.transport, "auto", slots, nodes)
    assert str(refused.value).startswith(
        "sync.transport=broadcast (sync.transport=auto's choice: engines on other nodes than the learner's) would put "
        f"learner rank 0 (the sender) and engine 0 in one NCCL group on the same GPU (bundle 0 on {HEAD})"
    )
    _, apart = plan_slots(placement.model_copy(update={"layout": "disaggregated"}), 4, gpus=True)
    check_broadcast_devices("broadcast", "broadcast", apart, dict.fromkeys(range(4), HEAD))  # a GPU each: fine
