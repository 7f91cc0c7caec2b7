"""Placement on a Ray cluster of several nodes: Ray's own test cluster (`ray.cluster_utils.Cluster`), a head
node holding the custom resource `learner_node` and a second node holding `engine_node`, on this one machine.

One cluster serves every check (its start-up is the expensive part), in this order:
- `sync.transport=shm` with the learner and the engine pinned to different nodes is refused once placed,
  before any actor starts, naming both roles and their nodes;
- `build_ray_roles` with `placement.address` joins the cluster and puts both learner ranks on the head node
  and the engine (HF) on the other; after an update, a push goes over `broadcast` (its group's rendezvous is
  the learner's node IP as Ray reports it), then, after more updates, over `object_store` and `disk`, on the
  same actors; after each the engine's log-probs equal the learner's (`sync/parity_abs_max`);
- learner rank 1 then hangs inside a step (a forward hook that sleeps): the call ends at its deadline naming
  `learner rank 1`, its actor and the line it hangs on, not rank 0, which waits for it in a collective.
"""

import re
import tempfile
import time
import types

import pytest

from relayrl.build import resolve
from relayrl.config import load_config
from relayrl.errors import PlacementError, RoleFailure
from tests.unit.test_sharded_scenarios import experience

pytestmark = pytest.mark.slow

HANG_DEADLINE_S = 8  # the update call's deadline in the hang check (start-up keeps the config's)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="mn", dir="/tmp")  # short: Ray's socket paths live under it
    nodes = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"learner_node": 1}, "temp_dir": temp_dir}
    )
    nodes.add_node(num_cpus=1, resources={"engine_node": 1}, temp_dir=temp_dir)
    yield nodes
    import ray

    ray.shutdown()
    nodes.shutdown()


def config(model_dir, address, *extra):
    """Engines run HF's `generate` (they load in seconds; vLLM's CPU build takes much longer to start, and the
    engine is not under test), set past the check that ray runs vLLM."""
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            "rollout.engine=vllm",
            "rollout.n=4",
            "rollout.prompts_per_step=4",
            "train.micro_batch=4",
            "placement.mode=ray",
            f"placement.address={address}",
            "placement.learner_ranks=2",
            "placement.learner_cpus=2",
            "placement.engine_cpus=1",
            "placement.learner_resources={learner_node: 1}",
            "placement.engine_resources={engine_node: 1}",
            "placement.call_timeout_s=120",
            "sync.parity_probe=true",
            "sync.bucket_mb=0.05",
            *extra,
        ],
    )
    return resolve(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "hf"})}))


def node_of(actor) -> str:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()), timeout=30)


def test_roles_on_two_nodes_sync_across_them_and_a_hung_rank_is_named(cluster, random_model_dir, tmp_path):
    from relayrl.placement.build import build_ray_roles
    from relayrl.placement.cluster import reserve
    from relayrl.sync.guard import PushGuard
    from relayrl.sync.remote import RaySync

    head, other = cluster.head_node.node_id, cluster.list_all_nodes()[1].node_id
    with pytest.raises(PlacementError) as refused:
        reserve(config(random_model_dir, cluster.address, "sync.transport=shm"))
    message = str(refused.value)
    assert "sync.transport=shm" in message and "shared memory does not cross nodes" in message
    assert f"learner on node {head[:12]}" in message and f"engine 0 on node {other[:12]}" in message

    cfg = config(random_model_dir, cluster.address, "sync.transport=broadcast")
    probe = list(range(4, 16))
    roles, guard = build_ray_roles(cfg, max_model_len=64), PushGuard(0.05, probe)
    try:
        learner, engine = roles.learner, roles.engines.replicas[0]
        assert [node_of(actor) for actor in learner.actors] == [head, head]
        assert node_of(engine._actor) == other
        for step, transport in enumerate(["broadcast", "object_store", "disk"]):
            result = learner.update(step, learner.prepare(experience(seed=step)))  # new weights for the push to carry
            assert result.metrics["actor/grad_norm"] > 0
            sync = roles.sync  # broadcast's group was formed by build_ray_roles, at the learner's node IP
            if transport != "broadcast":
                options = cfg.sync.model_copy(update={"transport": transport, "directory": str(tmp_path / "w")})
                sync = RaySync(options, transport, version=step)
                sync.setup(learner, types.SimpleNamespace(replicas=[engine], on_restart=None))
            guard.before_push(learner)
            assert sync.push(learner, roles.engines) == step + 1
            guard.after_push(roles.engines, sync)  # raises if the push changed no served log-prob
            assert sync.last["sync/bytes"] > 0
            assert guard.last["sync/parity_abs_max"] < 1e-4, transport  # the engine holds the learner's new weights

        def hang_in_forward(rank):  # runs in learner rank 1's actor: its learner's next forward sleeps in the step
            from relayrl.learner.sharded import transformer_blocks

            def hang(module, args):
                time.sleep(600)

            transformer_blocks(rank.learner.policy.model)[1].register_forward_pre_hook(hang)

        import ray

        ray.get(learner.actors[1].__ray_call__.remote(hang_in_forward), timeout=30)
        learner.timeout_s = HANG_DEADLINE_S
        start = time.monotonic()
        with pytest.raises(RoleFailure) as hung:
            learner.update(1, learner.prepare(experience(seed=1)))
        elapsed = time.monotonic() - start
        message = str(hung.value)
        assert hung.value.role == "learner rank 1"
        assert re.match(
            rf"learner rank 1 \(actor {learner.actor_id(1)}\) did not finish (prepare|update) within", message
        )
        assert "it hangs at" in message and "in hang: time.sleep(600)" in message
        assert message.endswith("learner rank 0 waits for it in a collective")
        assert elapsed < HANG_DEADLINE_S + 30
    finally:
        roles.close()
