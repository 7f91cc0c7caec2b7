"""`relayrl plan CONFIG plan.place=true`: where every role of a run would go, from the code the run uses, with nothing loaded.

The roles are placed as a run places them (`cluster.reserve`: the same bundles, strategy, deadlines and checks),
on the cluster at `placement.address`, on this machine, or on a simulated cluster (`SimulatedCluster`: Ray's own
`ray.cluster_utils.Cluster`, nodes with logical GPUs). A probe actor then starts in each role's slot with the
role's own Ray options (`cluster.actor_options`) and reports where Ray put it: node, bundle, the GPU ids it was
assigned, its CPUs and threads. No engine starts and no weights are read. A placement the cluster cannot hold fails
as the run would, naming the roles, what they ask for and what the cluster has.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from relayrl.config import Config, effective_transport
from relayrl.errors import ConfigError
from relayrl.placement.ray_head import NO_PRESTART


@dataclass(frozen=True)
class SimulatedCluster:
    """`nodes` nodes of `gpus_per_node` logical GPUs and `cpus_per_node` CPUs each (Ray's cluster_utils)."""

    nodes: int
    gpus_per_node: int
    cpus_per_node: int

    def check(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 0 or self.cpus_per_node < 1:
            raise ConfigError(
                f"relayrl plan: need plan.nodes >= 1, plan.gpus_per_node >= 0 and plan.cpus_per_node >= 1 (got "
                f"{self.nodes}, {self.gpus_per_node}, {self.cpus_per_node})"
            )


@dataclass(frozen=True)
class PlacedRole:
    """One row of the dry run: where Ray put the role's actor."""

    role: str
    node: str  # `node 1a2b3c4d5e6f (10.0.0.2)`
    bundle: int
    gpus: list[str]  # the GPU ids Ray assigned the actor (what its CUDA_VISIBLE_DEVICES shows)
    cpus: float
    threads: int


@dataclass(frozen=True)
class Placement:
    roles: list[PlacedRole]
    transport: str  # the weight transport that results (sync.transport=auto resolved for these nodes)
    cluster: str  # what was placed on: `simulated: 2 nodes x 2 GPUs, 8 CPUs`, an address, or `this machine`

    def to_json(self) -> str:
        return json.dumps([asdict(role) for role in self.roles], indent=1)


class _Probe:
    """Stands in the role's slot: says where it is, nothing else."""

    def where(self) -> tuple[str, list[str]]:
        import ray

        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()]


def place(config: Config, simulated: SimulatedCluster | None = None) -> Placement:
    """Place `config`'s roles (see the module docstring) and take the placement down again."""
    import ray

    from relayrl.placement.cluster import actor_options, bundle_nodes, reserve

    if config.placement.mode != "ray":
        raise ConfigError(
            "relayrl plan plan.place=true places Ray roles: set placement.mode=ray (local runs in one process)"
        )
    cluster = _start(simulated) if simulated is not None else None
    try:
        group, slots = reserve(config)  # joins placement.address or starts a head, unless connected already
        try:
            nodes = bundle_nodes(group)
            probes = [ray.remote(_Probe).options(**actor_options(group, slot)).remote() for slot in slots]
            answers = ray.get([p.where.remote() for p in probes], timeout=config.placement.placement_timeout_s)
        finally:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(group)
        roles = [
            PlacedRole(slot.role, nodes[slot.bundle], slot.bundle, gpus, slot.cpus, slot.threads)
            for slot, (_, gpus) in zip(slots, answers)
        ]
        where = _describe(simulated, config.placement.address)
        return Placement(roles, effective_transport(config), where)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def _start(simulated: SimulatedCluster):
    """Ray's simulated cluster on this machine, and this process connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    simulated.check()
    cpus, gpus = simulated.cpus_per_node, simulated.gpus_per_node
    os.environ.update(NO_PRESTART)  # read by each node's raylet as it starts (ray_head.py says why)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": cpus, "num_gpus": gpus, "include_dashboard": False}
    )
    for _ in range(simulated.nodes - 1):
        cluster.add_node(num_cpus=cpus, num_gpus=gpus)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def _describe(simulated: SimulatedCluster | None, address: str | None) -> str:
    if simulated is not None:
        return (
            f"simulated: {simulated.nodes} node(s) x {simulated.gpus_per_node} GPU(s), "
            f"{simulated.cpus_per_node} CPUs each"
        )
    return address or "this machine"


def print_placement(placement: Placement) -> None:
    """One row per role, then the transport."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"placement on {placement.cluster}")
    for column in ("role", "node", "bundle", "GPU ids", "CPUs", "threads"):
        table.add_column(column)
    for role in placement.roles:
        gpus = ",".join(role.gpus) or "-"
        table.add_row(role.role, role.node, str(role.bundle), gpus, f"{role.cpus:g}", str(role.threads))
    console = Console(width=120)
    console.print(table)
    console.print(f"weight sync: {placement.transport}")
