"""Ray placement: start or join the cluster, reserve bundles for the roles, start the role actors in them.

Disaggregated: a bundle per role (learner, each engine), packed on one node unless `placement.strategy` says
otherwise; each role is pinned to its own cores and runs while the others run. Colocated: one bundle that every
role shares (fractional CPUs), roles take turns. On a cluster with GPUs every bundle also holds the GPUs of its
roles (`plan_slots`): each learner rank one, each engine `rollout.tensor_parallel`, a colocated rank and engine
half of one each; an actor sees only the GPUs Ray assigned it. Which node a role lands on is Ray's choice under the strategy,
or the user's: `placement.learner_resources` / `engine_resources` add custom resources to the role's bundles, so
only the nodes started with them (`ray start --resources`) can hold it. Once placed, a transport that cannot
cross nodes (`shm`, `disk` in a private temporary directory) is refused naming the roles and their nodes, before
any actor starts, and so are model.path and log.dir missing on a node that holds a role (node_paths.py). Every
actor gets the driver's NCCL_*, GLOO_* and *_SOCKET_IFNAME variables. Every bundle holds CPU (an actor in a
CPU-less bundle cannot start), thread counts are set explicitly in every actor, and the placement group is awaited
with a deadline: a placement that cannot fit fails naming the roles, what they asked for and what the cluster has.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass

from relayrl.config import Config, PlacementConfig, SyncConfig, TeacherConfig
from relayrl.errors import PlacementError
from relayrl.placement.node_paths import check_node_paths, shared_paths
from relayrl.run.preflight import forwarded_env

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
    """Where one role's actor goes: its bundle, the CPUs and GPUs it reserves there, its threads and cores."""

    role: str  # "learner", "learner rank 1", "engine 0"
    bundle: int
    cpus: float
    threads: int
    cores: str
    gpus: float = 0.0  # what the actor asks Ray for (num_gpus): Ray then shows it those GPUs alone

    @property
    def is_learner(self) -> bool:
        return self.role.startswith("learner")


def plan_slots(
    placement: PlacementConfig, machine_cores: int, gpus: bool = False, tensor_parallel: int = 1, teacher: float = 0
) -> tuple[list[dict], list[Slot]]:
    """The bundles to reserve and the slot of each role: the learner's first, then engine 0..N-1, then (`teacher`:
    its CPUs, teacher.engine=actor) the teacher's bundle of its own, with one GPU of its own on GPUs.

    Without GPUs in the cluster, the learner's W ranks share one bundle (`learner`). With GPUs (`gpus`), every
    actor takes its devices from the bundles: disaggregated, each learner rank a bundle with one GPU (so ranks
    may land on different nodes) and each engine a bundle with its `tensor_parallel` GPUs; colocated, learner rank
    i and engine i share bundle i's one GPU (half each, the OpenRLHF way). Which GPU an actor gets is Ray's
    assignment, never a rank modulo a count."""
    bundles, slots = _plan_gpu_slots(placement, tensor_parallel) if gpus else _plan_cpu_slots(placement, machine_cores)
    if teacher:  # its threads, unpinned (as the learner's)
        bundles.append({"CPU": teacher, **({"GPU": 1.0} if gpus else {})})
        slots.append(Slot("teacher", len(bundles) - 1, teacher, max(1, math.floor(teacher)), "", float(gpus)))
    return bundles, slots


def _plan_cpu_slots(placement: PlacementConfig, machine_cores: int) -> tuple[list[dict], list[Slot]]:
    """plan_slots on a cluster without GPUs (see there)."""
    n = placement.engines
    learner_threads, engine_threads = _threads(placement)
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


def _threads(placement: PlacementConfig) -> tuple[int, int]:
    learner = placement.learner_threads or max(1, math.floor(placement.learner_cpus))
    return learner, placement.engine_threads or max(1, math.floor(placement.engine_cpus))


def _plan_gpu_slots(placement: PlacementConfig, tensor_parallel: int) -> tuple[list[dict], list[Slot]]:
    """plan_slots on a cluster with GPUs (see there). A rank's CPUs are its share of learner_cpus."""
    ranks, n = placement.learner_ranks, placement.engines
    learner_threads, engine_threads = _threads(placement)
    learner_extra, engine_extra = dict(placement.learner_resources), dict(placement.engine_resources)
    rank_cpus, rank_threads = placement.learner_cpus / ranks, max(1, learner_threads // ranks)
    names = ["learner"] if ranks == 1 else [f"learner rank {r}" for r in range(ranks)]
    if placement.layout == "colocated":
        if tensor_parallel > 1 or n != ranks:
            raise PlacementError(
                "placement.layout=colocated on GPUs puts learner rank i and engine i on GPU i: it needs "
                f"placement.engines = placement.learner_ranks (got {n} and {ranks}) and rollout.tensor_parallel=1 "
                f"(got {tensor_parallel}); use placement.layout=disaggregated for other shapes"
            )
        cpus = max(rank_cpus, placement.engine_cpus)
        bundles = [{"CPU": 2 * cpus, "GPU": 1.0, **engine_extra, **learner_extra} for _ in range(ranks)]
        slots = [Slot(name, r, cpus, rank_threads, "", gpus=0.5) for r, name in enumerate(names)]
        slots += [Slot(f"engine {i}", i, cpus, engine_threads, "", gpus=0.5) for i in range(n)]
        return bundles, slots
    bundles = [{"CPU": rank_cpus, "GPU": 1.0, **learner_extra} for _ in range(ranks)]
    bundles += [{"CPU": placement.engine_cpus, "GPU": float(tensor_parallel), **engine_extra} for _ in range(n)]
    slots = [Slot(name, r, rank_cpus, rank_threads, "", gpus=1.0) for r, name in enumerate(names)]
    slots += [
        Slot(f"engine {i}", ranks + i, placement.engine_cpus, engine_threads, "", gpus=float(tensor_parallel))
        for i in range(n)
    ]
    return bundles, slots


def split_slots(slots: list[Slot]) -> tuple[list[Slot], list[Slot]]:
    """(the learner's slots: one, or one per rank; the engines' slots, in order). The teacher's is `teacher_slot`."""
    return [s for s in slots if s.is_learner], [s for s in slots if s.role.startswith("engine")]


def teacher_slot(slots: list[Slot]) -> Slot | None:
    """The slot of the teacher's own actor (teacher.engine=actor), if the run has one."""
    return next((s for s in slots if s.role == "teacher"), None)


def teacher_cpus(teacher: TeacherConfig) -> float:
    """The CPUs of the teacher's own bundle: teacher.cpus with teacher.engine=actor or vllm, else 0 (no bundle)."""
    return teacher.cpus if teacher.present and teacher.engine in ("actor", "vllm") else 0.0


def start_ray(placement: PlacementConfig) -> None:
    """Join `placement.address`, or start this run's own head in a session of its own (see `ray_head.py`: a
    signal to the driver's process group must not reach Ray) and join it; the head ends when the driver does."""
    import atexit

    import ray

    from relayrl.placement import ray_head

    global _head
    if ray.is_initialized():
        if not _joined_elsewhere(placement.address):
            return  # this process's cluster (a previous run's, or the user's own ray.init) serves this run too
        leave_ray()  # connected to another cluster than the one placement.address names: join that one
    if placement.address:
        ray.init(address=placement.address, include_dashboard=False, log_to_driver=True)
        return
    if _head is not None:  # a previous cluster of this process, disconnected since
        _head.stop()
    _head = ray_head.start_head(int(placement.num_cpus or os.cpu_count() or 1))
    atexit.register(_head.stop)  # registered before ray.init's own hook, so it runs after Ray's shutdown
    ray.init(address=_head.address, log_to_driver=True, runtime_env={"env_vars": WORKER_ENV})


_head = None  # the head this driver started, if any


def _joined_elsewhere(address: str | None) -> bool:
    """Whether this process is connected to a cluster other than `address` (host:port; none or `auto`: any will do).
    The same port on this machine by another name (loopback vs the node's IP, as Ray reports it) is the same head."""
    import ipaddress
    import socket

    import ray

    if not address or address == "auto" or "://" in address:
        return False
    joined = ray.get_runtime_context().gcs_address
    (host, _, port), (joined_host, _, joined_port) = address.rpartition(":"), joined.rpartition(":")
    if port != joined_port:
        return True
    with contextlib.suppress(OSError, ValueError):  # a name that does not resolve is compared as written
        host, joined_host = socket.gethostbyname(host), socket.gethostbyname(joined_host)
    node = ray.util.get_node_ip_address()

    def here(h: str) -> bool:
        with contextlib.suppress(ValueError):
            return h == node or ipaddress.ip_address(h).is_loopback
        return False

    return host != joined_host and not (here(host) and here(joined_host))


def leave_ray() -> None:
    """Disconnect this process from Ray and end the head it started, if any: for a process that runs several
    runs one after another (the test suite) and must not carry one run's cluster into the next. A no-op where Ray
    was never imported."""
    global _head
    if "ray" not in sys.modules:
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if _head is not None:
        _head.stop()
        _head = None


def reserve(config: Config):
    """The placement group for every role, placed within `placement.placement_timeout_s`, and the slots. Joins
    (or starts) the cluster first, unless this process is connected to one already (`relayrl plan plan.place=true` on a
    simulated cluster)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    placement = config.placement
    if not ray.is_initialized() and not placement.address:  # the cluster we are about to start: its size is known
        cpus = float(placement.num_cpus or os.cpu_count() or 1)
        gpus, tp, teacher = local_gpus(), config.rollout.tensor_parallel, teacher_cpus(config.teacher)
        bundles, _ = plan_slots(placement, os.cpu_count() or 1, gpus > 0, tp, teacher)
        check_fits(placement, bundles, {"CPU": cpus, "GPU": gpus}, {"CPU": cpus, "GPU": gpus}, bool(teacher))
    start_ray(placement)
    total, free = ray.cluster_resources(), ray.available_resources()
    teacher = teacher_cpus(config.teacher)
    bundles, slots = plan_slots(
        placement, os.cpu_count() or 1, total.get("GPU", 0) > 0, config.rollout.tensor_parallel, teacher
    )
    check_fits(placement, bundles, total, free, bool(teacher))
    group = placement_group(bundles, strategy=placement.strategy)
    if not group.wait(timeout_seconds=placement.placement_timeout_s):
        remove_placement_group(group)
        raise PlacementError(
            unplaceable_message(placement, bundles, ray.cluster_resources(), ray.available_resources())
        )
    try:
        nodes, asked = bundle_nodes(group), config.sync.transport
        check_transport_nodes(config.sync, slots, nodes)
        check_broadcast_devices(config.sync.transport, asked, slots, nodes)
        roles = {slot.bundle: [s.role for s in slots if s.bundle == slot.bundle] for slot in slots}
        paths = shared_paths(config.model.path, config.log.dir)
        check_node_paths(group, roles, nodes, paths, placement.placement_timeout_s, driver_node())
    except PlacementError:
        remove_placement_group(group)
        raise
    return group, slots


def local_gpus() -> int:
    """CUDA devices this machine has (what a head this run starts would offer Ray), without initialising CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_fits(placement: PlacementConfig, bundles: list[dict], total: dict, free: dict, teacher: bool = False) -> None:
    """Raise at once when the bundles ask for more CPUs, or more of a resource, than the cluster has in all:
    waiting for the placement group could only end at its deadline with the same message. `teacher`: the last
    bundle is the teacher's own (teacher.engine=actor)."""
    if sum(b["CPU"] for b in bundles) > total.get("CPU", 0) + 1e-9:
        raise PlacementError(unplaceable_message(placement, bundles, total, free, teacher))
    if (asked := sum(b.get("GPU", 0) for b in bundles)) > total.get("GPU", 0) + 1e-9:
        raise PlacementError(
            f"placement.layout={placement.layout} asks for {asked:g} GPUs ({gpu_roles(placement, bundles, teacher)}) but the "
            f"cluster has {total.get('GPU', 0):g} ({free.get('GPU', 0):g} free). Lower placement.learner_ranks, "
            "placement.engines or rollout.tensor_parallel"
            + (", use teacher.engine=local" if teacher else "")
            + ", or add nodes with GPUs"
        )
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


def unplaceable_message(
    placement: PlacementConfig, bundles: list[dict], total: dict, free: dict, teacher: bool = False
) -> str:
    asked = sum(b["CPU"] for b in bundles)
    if placement.layout == "colocated":
        roles = f"learner and {placement.engines} engine(s) sharing one bundle of {{CPU: {bundles[0]['CPU']:g}}}"
    else:
        roles = (
            f"learner {{CPU: {placement.learner_cpus:g}}} + {placement.engines} engine(s) "
            f"{{CPU: {placement.engine_cpus:g}}} each"
        )
    if teacher:
        roles += f" + the teacher {{CPU: {bundles[-1]['CPU']:g}}} (teacher.cpus)"
    if placement.strategy != "PACK" or placement.learner_resources or placement.engine_resources:
        roles += f" (bundles {bundles}, placement.strategy={placement.strategy})"
    return (
        f"placement.layout={placement.layout} could not be placed within {placement.placement_timeout_s:g} s: "
        f"{roles} = {asked:g} CPUs, but the cluster has {total.get('CPU', 0):g} CPUs "
        f"({free.get('CPU', 0):g} free). Lower placement.engines, placement.engine_cpus or "
        "placement.learner_cpus, or use placement.layout=colocated"
    )


def gpu_roles(placement: PlacementConfig, bundles: list[dict], teacher: bool = False) -> str:
    """What asks for the GPUs, role by role, for a message: `learner rank 0: 1, ..., engine 0: 2, teacher: 1`."""
    ranks = placement.learner_ranks
    names = ["learner"] if ranks == 1 else [f"learner rank {r}" for r in range(ranks)]
    if placement.layout == "colocated":
        names = [f"{name} + engine {r}" for r, name in enumerate(names)]
    names += [f"engine {i}" for i in range(len(bundles) - len(names) - teacher)] + ["teacher"] * teacher
    return ", ".join(f"{name}: {b.get('GPU', 0):g}" for name, b in zip(names, bundles))


def bundle_nodes(group) -> dict[int, str]:
    """Where each bundle of a placed group is: `node 1a2b3c4d5e6f (10.0.0.2)`, Ray's node id (shortened) and IP."""
    import ray
    from ray.util import placement_group_table

    ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    placed = placement_group_table(group)["bundles_to_node_id"]
    return {int(index): node_label(node, ips) for index, node in placed.items()}


def node_label(node: str, ips: dict[str, str]) -> str:
    return f"node {node[:12]} ({ips.get(node, '?')})"


def driver_node() -> str:
    """This driver's node, labelled as bundle_nodes labels a bundle's."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    return node_label(here, {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()})


def check_transport_nodes(sync: SyncConfig, slots: list[Slot], nodes: dict[int, str]) -> None:
    """Refuse a weight transport that cannot reach an engine on another node than the learner's: `shm` (one
    node's memory), or `disk` in a private temporary directory (one node's file system). `nodes`: bundle_nodes.
    `sync.transport=auto` is resolved here, once the nodes are known: set to broadcast when they differ (on one
    node it is shm under Ray, as `effective_transport` says)."""
    transport = "shm" if sync.transport == "auto" else sync.transport
    learner_node = nodes[slots[0].bundle]
    away = [slot for slot in slots[1:] if nodes[slot.bundle] != learner_node and slot.role != "teacher"]
    if not away or transport not in ("shm", "disk") or (transport == "disk" and sync.directory):
        return
    if sync.transport == "auto":  # auto: shared memory on one node, broadcast across nodes
        sync.transport = "broadcast"
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


def check_broadcast_devices(transport: str, asked: str, slots: list[Slot], nodes: dict[int, str]) -> None:
    """Refuse a `broadcast` whose receiver holds a GPU in the sender's bundle (colocated: engine 0 beside learner
    rank 0, half a GPU each): NCCL cannot hold two ranks of one group on one GPU ("Duplicate GPU detected" at the
    first push). `asked`: sync.transport as set, before `auto` was resolved."""
    sender = slots[0]
    if transport != "broadcast" or not sender.gpus:
        return
    beside = [s.role for s in slots if not s.is_learner and s.bundle == sender.bundle and s.gpus]
    if not beside:
        return
    why = " (sync.transport=auto's choice: engines on other nodes than the learner's)" if asked == "auto" else ""
    raise PlacementError(
        f"sync.transport=broadcast{why} would put {sender.role} (the sender) and {beside[0]} in one NCCL group on "
        f"the same GPU (bundle {sender.bundle} on {nodes[sender.bundle]}); NCCL refuses two ranks of a group on one "
        "GPU. Use sync.transport=shm (engines on the learner's node) or object_store (any node), or "
        "placement.layout=disaggregated"
    )


def actor_options(group, slot: Slot, extra_env: dict | None = None) -> dict:
    """Ray options of a role's actor in its bundle: its CPUs and GPUs (Ray then shows the actor the GPUs it was
    assigned, and no others), its threads, the run's environment: the driver's NCCL_*, GLOO_* and *_SOCKET_IFNAME
    variables included (an actor on another node would not inherit them)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    env = {**forwarded_env(os.environ), **WORKER_ENV, "OMP_NUM_THREADS": str(slot.threads), **(extra_env or {})}
    return {
        "num_cpus": slot.cpus,
        **({"num_gpus": slot.gpus} if slot.gpus else {}),
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=slot.bundle
        ),
        "runtime_env": {"env_vars": env},
        "max_restarts": 0,  # a dead role is reported (and engines restarted) by the driver, with fresh weights
    }
