"""Roles placed on Ray clusters with logical GPUs (Ray's own cluster_utils on this CPU), by the code a run uses
(`relayrl plan CONFIG plan.place=true`, relayrl/placement/dry_run.py): each role's actor reports the GPU ids Ray assigned it."""

from __future__ import annotations

import json

import pytest

from relayrl.config import load_config
from relayrl.errors import PlacementError
from relayrl.placement.dry_run import SimulatedCluster, place

BASE = ["placement.mode=ray", "rollout.engine=vllm", "model.path=/models/absent"]


def config(*overrides: str):
    return load_config(None, [*BASE, *overrides])  # model.path need not exist: nothing is loaded


def by_role(placement) -> dict:
    return {role.role: role for role in placement.roles}


def test_disaggregated_on_one_node_of_four_gives_every_role_its_own_gpus():
    placement = place(
        config("placement.learner_ranks=2", "placement.engines=2", "placement.learner_cpus=2"),
        SimulatedCluster(nodes=1, gpus_per_node=4, cpus_per_node=8),
    )
    roles = by_role(placement)
    assert list(roles) == ["learner rank 0", "learner rank 1", "engine 0", "engine 1"]
    ids = [gpu for role in placement.roles for gpu in role.gpus]
    assert all(len(role.gpus) == 1 for role in placement.roles) and sorted(ids) == ["0", "1", "2", "3"]
    assert {role.bundle for role in placement.roles} == {0, 1, 2, 3} and placement.transport == "shm"


def test_ranks_spread_over_nodes_and_the_sync_crosses_nodes():
    one_gpu_each = SimulatedCluster(nodes=3, gpus_per_node=1, cpus_per_node=2)
    spread = by_role(place(config("placement.learner_ranks=2"), one_gpu_each))
    assert len({role.node for role in spread.values()}) == 3  # each rank a bundle of its own: on its own node
    two_nodes = SimulatedCluster(nodes=2, gpus_per_node=2, cpus_per_node=4)
    packed = place(
        config("placement.learner_ranks=2", "rollout.tensor_parallel=2", "placement.engine_cpus=2"), two_nodes
    )
    roles = by_role(packed)
    assert roles["learner rank 0"].node == roles["learner rank 1"].node != roles["engine 0"].node
    assert len(roles["engine 0"].gpus) == 2  # a tensor-parallel engine: its T GPUs, on the other node
    assert packed.transport == "broadcast"  # sync.transport=auto across nodes


def test_colocated_puts_learner_rank_i_and_engine_i_on_one_gpu():
    placement = place(
        config("placement.layout=colocated", "placement.learner_ranks=2", "placement.engines=2"),
        SimulatedCluster(nodes=1, gpus_per_node=2, cpus_per_node=8),
    )
    roles = by_role(placement)
    for i in range(2):
        assert roles[f"learner rank {i}"].gpus == roles[f"engine {i}"].gpus and len(roles[f"engine {i}"].gpus) == 1
    assert roles["learner rank 0"].gpus != roles["learner rank 1"].gpus
    assert json.loads(placement.to_json())[0].keys() == {"role", "node", "bundle", "gpus", "cpus", "threads"}


def test_a_placement_the_cluster_cannot_hold_fails_at_once_naming_roles_and_gpus():
    with pytest.raises(PlacementError, match=r"asks for 6 GPUs \(learner rank 0: 1, learner rank 1: 1, engine 0: 2, "
                       r"engine 1: 2\) but the cluster has 4"):  # fmt: skip
        place(
            config("placement.learner_ranks=2", "placement.engines=2", "rollout.tensor_parallel=2",
                   "placement.engine_cpus=2", "placement.learner_cpus=2"),
            SimulatedCluster(nodes=1, gpus_per_node=4, cpus_per_node=16),
        )  # fmt: skip
    with pytest.raises(PlacementError, match=r"colocated on GPUs puts learner rank i and engine i on GPU i"):
        place(
            config("placement.layout=colocated", "placement.learner_ranks=2", "placement.engines=1"),
            SimulatedCluster(nodes=1, gpus_per_node=2, cpus_per_node=8),
        )


def test_relayrl_plan_place_prints_the_rows_as_json_and_refuses_stray_flags(tmp_path, capsys):
    from relayrl.cli import main

    path = tmp_path / "config.yaml"
    path.write_text("model: {path: /models/absent}\nrollout: {engine: vllm}\nplacement: {mode: ray, engines: 1}\n")
    assert (
        main(["plan", str(path), "plan.place=true", "plan.nodes=1", "plan.gpus_per_node=2", "plan.as_json=true"]) == 0
    )
    out = capsys.readouterr().out
    rows = json.loads(out[out.index("[") :])
    assert [(row["role"], len(row["gpus"])) for row in rows] == [("learner", 1), ("engine 0", 1)]
    assert main(["plan", str(path), "plan.as_json=true"]) == 2
    assert (
        "plan.nodes, plan.gpus_per_node, plan.cpus_per_node and plan.as_json go with plan.place=true"
        in capsys.readouterr().err
    )


def test_every_node_is_asked_for_model_path_and_log_dir_and_one_that_lacks_one_is_named(tmp_path):
    """relayrl/placement/node_paths.py on two simulated nodes (one file system here: a path absent everywhere stands
    for one a node lacks)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from relayrl.placement.cluster import bundle_nodes
    from relayrl.placement.dry_run import _start
    from relayrl.placement.node_paths import check_node_paths

    cluster = _start(SimulatedCluster(nodes=2, gpus_per_node=0, cpus_per_node=1))
    try:
        group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
        assert group.wait(timeout_seconds=60)
        nodes, roles = bundle_nodes(group), {0: ["learner"], 1: ["engine 0"]}
        assert sorted(check_node_paths(group, roles, nodes, {"model.path": str(tmp_path)}, 60)) == sorted(
            nodes.values()
        )  # both nodes asked, both have it
        assert check_node_paths(group, roles, nodes, {"model.path": str(tmp_path)}, 60, nodes[0]) == [nodes[1]]
        # the driver's own node is not asked: the paths are the driver's
        with pytest.raises(PlacementError) as refused:
            check_node_paths(group, roles, nodes, {"log.dir": str(tmp_path / "absent")}, 60)
        assert str(refused.value).startswith(f"log.dir {tmp_path / 'absent'}: not a directory on {nodes[0]}, where "
                                             "learner run(s)")  # fmt: skip
        remove_placement_group(group)
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_broadcast_into_an_engine_on_the_senders_gpu_is_refused_naming_both():
    """Colocated on GPUs, engine 0 holds half of learner rank 0's GPU: one NCCL group cannot hold both."""
    one_gpu = SimulatedCluster(nodes=1, gpus_per_node=1, cpus_per_node=4)
    with pytest.raises(PlacementError) as refused:
        place(config("placement.layout=colocated", "sync.transport=broadcast"), one_gpu)
    message = str(refused.value)
    assert message.startswith("sync.transport=broadcast would put learner (the sender) and engine 0 in one NCCL group ")
    assert "on the same GPU (bundle 0 on node " in message and "Use sync.transport=shm" in message
    assert (
        place(config("placement.layout=colocated", "sync.transport=object_store"), one_gpu).transport == "object_store"
    )
