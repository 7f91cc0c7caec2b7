"""model.path and log.dir on every node that runs a role, checked once the roles are placed, before any starts.

Every role reads model.path on its own node (HF_HUB_OFFLINE: nothing is downloaded), and every learner rank
writes its checkpoint shards into log.dir on its node. A path the driver sees but a node does not would fail
there minutes later (an engine that cannot load, a checkpoint half written); this asks each node once, with a
task in the first bundle placed on it, and refuses naming the node, its roles and the path. Only the paths that
exist on the driver are asked about (a hub id, or a log.dir the run has not made yet, are not paths to share).
"""

from __future__ import annotations

import os

from relayrl.errors import PlacementError


def missing_here(paths: dict[str, str]) -> list[str]:
    """The keys of `paths` that are not a directory on this node (run on each node)."""
    return [key for key, path in paths.items() if not os.path.isdir(path)]


def shared_paths(model_path: str, log_dir: str) -> dict[str, str]:
    """model.path and log.dir, those that are directories here."""
    paths = {"model.path": model_path, "log.dir": log_dir}
    return {key: os.path.abspath(path) for key, path in paths.items() if path and os.path.isdir(path)}


def check_node_paths(group, roles_by_bundle: dict[int, list[str]], nodes: dict[int, str], paths: dict[str, str],
                     timeout_s: float, driver_node: str = "") -> list[str]:  # fmt: skip
    """Ask every node holding a bundle whether it has `paths`; raise naming the first node that lacks one.
    `roles_by_bundle`: the roles in each bundle; `nodes`: bundle -> `node 1a2b.. (ip)` (cluster.bundle_nodes).
    `driver_node` (labelled alike) is not asked: `paths` are those the driver has. Returns the nodes asked (none on
    one node: no task, no worker started for it)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    first: dict[str, int] = {}
    for bundle in sorted(roles_by_bundle):
        if nodes[bundle] != driver_node:
            first.setdefault(nodes[bundle], bundle)
    if not paths or not first:
        return []
    probe = ray.remote(num_cpus=0)(missing_here)
    refs = [
        probe.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=b)
        ).remote(paths)
        for b in first.values()
    ]
    answers = dict(zip(first, ray.get(refs, timeout=timeout_s)))
    problem = node_paths_problem(answers, paths, roles_by_bundle, nodes)
    if problem:
        raise PlacementError(problem)
    return list(first)


def node_paths_problem(
    missing: dict[str, list[str]], paths: dict[str, str], roles_by_bundle: dict[int, list[str]], nodes: dict[int, str]
) -> str | None:
    """The message for the first node that lacks a path (`missing`: node -> the keys it lacks), or None."""
    for node, keys in missing.items():
        if keys:
            roles = ", ".join(role for b, names in roles_by_bundle.items() if nodes[b] == node for role in names)
            lacking = "; ".join(f"{key} {paths[key]}" for key in keys)
            return (
                f"{lacking}: not a directory on {node}, where {roles} run(s), though this driver has it. Every node "
                "that runs a role reads model.path and writes checkpoints into log.dir: put them on a file system "
                "every node mounts (or the same path on each node)"
            )
    return None
