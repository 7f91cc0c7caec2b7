"""Ray placement: start or join the cluster, reserve bundles for the roles, start the role actors in them.

Disaggregated: a bundle per role (learner, each engine), packed on one node unless `placement.strategy` says
otherwise; each role is pinned to its own cores and runs while the others run. Colocated: one bundle that every
role shares (fractional CPUs), roles take turns. Which node a role lands on is Ray's choice under the strategy,
or the user's: `placement.learner_resources` / `engine_resources` add custom resources to the role's bundles, so
only the nodes started with them (`ray start --resources`) can hold it. Once placed, a transport that cannot
cross nodes (`shm`, `disk` in a private temporary directory) is refused naming the roles and their nodes, before
any actor starts. Every bundle holds CPU (an actor in a CPU-less bundle cannot start), thread counts are set
explicitly in every actor, and the placement group is awaited with a deadline: a placement that cannot
fit fails naming the roles, what they asked for and what the cluster has.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from relayrl.config import Config, PlacementConfig, effective_transport
from relayrl.errors import PlacementError

# Every actor: offline, quiet tokenizers, every line of its log, no progress bars (Ray forwards an actor's output
# late: a save's "Writing model shards" bar could land after the driver's last line, a preempted run's resume
# command). An engine's own environment, vLLM's included, is set by the engine itself before it imports
# anything: relayrl/rollout/vllm_engine.py.
WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "RAY_DEDUP_LOGS": "0",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


@dataclass(frozen=True)
class Slot:
    """Where one role's actor goes: its bundle, the CPUs it reserves there, its threads and cores."""

    role: str
    bundle: int
    cpus: float
    threads: int
    cores: str


def plan_slots(placement: PlacementConfig, machine_cores: int) -> tuple[list[dict], list[Slot]]:
    """The bundles to reserve and the slot of each role: the learner first, then engine 0..N-1."""
    n = placement.engines
    learner_threads = placement.learner_threads or max(1, math.floor(placement.learner_cpus))
    engine_threads = placement.engine_threads or max(1, math.floor(placement.engine_cpus))
    learner_extra, engine_extra = dict(placement.learner_resources), dict(placement.engine_resources)
    if placement.layout == "colocated":
        size = max(placement.learner_cpus, placement.engine_cpus)
        share = size / (n + 1)
        every = f"0-{max(0, min(machine_cores, math.ceil(size)) - 1)}"
        slots = [Slot("learner", 0, share, learner_threads, every)]
        slots += [Slot(f"engine {i}", 0, share, engine_threads, every) for i in range(n)]
        return [{"CPU": size, **engine_extra, **learner_extra}], slots
    bundles = [{"CPU": placement.learner_cpus, **learner_extra}]
    bundles += [{"CPU": placement.engine_cpus, **engine_extra} for _ in range(n)]
    slots, first = [], 0
    for index, (role, threads) in enumerate(
        [("learner", learner_threads)] + [(f"engine {i}", engine_threads) for i in range(n)]
    ):
        cores = [(first + k) % machine_cores for k in range(threads)]
        first += threads
        slots.append(Slot(role, index, bundles[index]["CPU"], threads, ",".join(map(str, cores))))
    return bundles, slots


def start_ray(placement: PlacementConfig) -> None:
    """Join `placement.address`, or start this run's own head in a session of its own (see `ray_head.py`: a
    signal to the driver's process group must not reach Ray) and join it; the head ends when the driver does."""
    import atexit

    import ray

    from relayrl.placement import ray_head

    global _head
    if ray.is_initialized():
        return
    if placement.address:
        ray.init(address=placement.address, include_dashboard=False, log_to_driver=True)
        return
    if _head is not None:  # a previous cluster of this process, disconnected since
        _head.stop()
    _head = ray_head.start_head(int(placement.num_cpus or os.cpu_count() or 1))
    atexit.register(_head.stop)  # registered before ray.init's own hook, so it runs after Ray's shutdown
    ray.init(address=_head.address, log_to_driver=True, runtime_env={"env_vars": WORKER_ENV})


_head = None  # the head this driver started, if any


def reserve(config: Config):
    """The placement group for every role, placed within `placement.placement_timeout_s`, and the slots."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    placement = config.placement
    bundles, slots = plan_slots(placement, os.cpu_count() or 1)
    if not placement.address:  # the cluster we are about to start: its size is known now
        cpus = float(placement.num_cpus or os.cpu_count() or 1)
        check_fits(placement, bundles, {"CPU": cpus}, {"CPU": cpus})
    start_ray(placement)
    check_fits(placement, bundles, ray.cluster_resources(), ray.available_resources())
    group = placement_group(bundles, strategy=placement.strategy)
    if not group.wait(timeout_seconds=placement.placement_timeout_s):
        remove_placement_group(group)
        raise PlacementError(
            unplaceable_message(placement, bundles, ray.cluster_resources(), ray.available_resources())
        )
    try:
        check_transport_nodes(config, slots, bundle_nodes(group))
    except PlacementError:
        remove_placement_group(group)
        raise
    return group, slots


def check_fits(placement: PlacementConfig, bundles: list[dict], total: dict, free: dict) -> None:
    """Raise at once when the bundles ask for more CPUs, or more of a resource, than the cluster has in all:
    waiting for the placement group could only end at its deadline with the same message."""
    if sum(b["CPU"] for b in bundles) > total.get("CPU", 0) + 1e-9:
        raise PlacementError(unplaceable_message(placement, bundles, total, free))
    for key, extra in (
        ("learner_resources", placement.learner_resources),
        ("engine_resources", placement.engine_resources),
    ):
        for name in extra:
            asked = sum(b.get(name, 0) for b in bundles)
            if asked > total.get(name, 0) + 1e-9:
                custom = sorted(
                    k
                    for k in total
                    if k not in ("CPU", "GPU", "memory", "object_store_memory") and not k.startswith("node:")
                )
                raise PlacementError(
                    f"placement.{key} asks for {name}: {asked:g} in all, but the cluster has "
                    f"{total.get(name, 0):g} (its custom resources: {', '.join(custom) or 'none'}); start the nodes "
                    f"that should hold the role with `ray start --resources '{{\"{name}\": N}}'`"
                )


def unplaceable_message(placement: PlacementConfig, bundles: list[dict], total: dict, free: dict) -> str:
    asked = sum(b["CPU"] for b in bundles)
    if placement.layout == "colocated":
        roles = f"learner and {placement.engines} engine(s) sharing one bundle of {{CPU: {bundles[0]['CPU']:g}}}"
    else:
        roles = (
            f"learner {{CPU: {placement.learner_cpus:g}}} + {placement.engines} engine(s) "
            f"{{CPU: {placement.engine_cpus:g}}} each"
        )
    if placement.strategy != "PACK" or placement.learner_resources or placement.engine_resources:
        roles += f" (bundles {bundles}, placement.strategy={placement.strategy})"
    return (
        f"placement.layout={placement.layout} could not be placed within {placement.placement_timeout_s:g} s: "
        f"{roles} = {asked:g} CPUs, but the cluster has {total.get('CPU', 0):g} CPUs "
        f"({free.get('CPU', 0):g} free). Lower placement.engines, placement.engine_cpus or "
        "placement.learner_cpus, or use placement.layout=colocated"
    )


def bundle_nodes(group) -> dict[int, str]:
    """Where each bundle of a placed group is: `node 1a2b3c4d5e6f (10.0.0.2)`, Ray's node id (shortened) and IP."""
    import ray
    from ray.util import placement_group_table

    ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    placed = placement_group_table(group)["bundles_to_node_id"]
    return {int(index): f"node {node[:12]} ({ips.get(node, '?')})" for index, node in placed.items()}


def check_transport_nodes(config: Config, slots: list[Slot], nodes: dict[int, str]) -> None:
    """Refuse a weight transport that cannot reach an engine on another node than the learner's: `shm` (one
    node's memory), or `disk` in a private temporary directory (one node's file system). `nodes`: bundle_nodes.
    `sync.transport=auto` is resolved here, once the nodes are known: set to broadcast when they differ."""
    transport = effective_transport(config)
    learner_node = nodes[slots[0].bundle]
    away = [slot for slot in slots[1:] if nodes[slot.bundle] != learner_node]
    if not away or transport not in ("shm", "disk") or (transport == "disk" and config.sync.directory):
        return
    if config.sync.transport == "auto":  # auto: shared memory on one node, broadcast across nodes
        config.sync.transport = "broadcast"
        print(f"relayrl: sync.transport=auto is broadcast: engines on other nodes than the learner's ({learner_node})")
        return
    where = "; ".join(f"{slot.role} on {nodes[slot.bundle]}" for slot in away)
    why = {
        "shm": "shared memory does not cross nodes",
        "disk": "sync.directory is '' (a temporary directory on the learner's node)",
    }[transport]
    raise PlacementError(
        f"sync.transport={transport} cannot reach engines on other nodes than the learner's ({why}): "
        f"learner on {learner_node}; {where}. Use sync.transport=broadcast or object_store (or disk "
        "with sync.directory on a file system every node mounts), or place the roles on one node "
        "(placement.strategy=STRICT_PACK, or placement.learner_resources / engine_resources)"
    )


def actor_options(group, slot: Slot, extra_env: dict | None = None) -> dict:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    env = {**WORKER_ENV, "OMP_NUM_THREADS": str(slot.threads), **(extra_env or {})}
    return {
        "num_cpus": slot.cpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=slot.bundle
        ),
        "runtime_env": {"env_vars": env},
        "max_restarts": 0,  # a dead role is reported (and engines restarted) by the driver, with fresh weights
    }


def engine_actor_options(config) -> dict:
    """Ray options of an engine actor beyond its CPUs, from what its config section asks: a T-rank engine
    (`rollout.tensor_parallel`) takes the GPUs its bundle reserves (`placement.engine_resources`)."""
    gpus = config.placement.engine_resources.get("GPU", 0) if config.rollout.tensor_parallel > 1 else 0
    return {"num_gpus": gpus} if gpus else {}
