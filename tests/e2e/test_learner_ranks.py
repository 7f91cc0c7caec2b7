"""`placement.learner_ranks=2` on Ray: two learner actors in one placement group behind one handle.

The handle's `prepare`/`update` split the batch by whole groups across the ranks and join the results: the
step's loss and weights equal one plain learner's. Pushes from the shards over the object store and over a
broadcast group (one call each, every bucket) carry those weights. A killed rank ends the next call naming `learner rank 1` at once, not
after a collective's timeout."""

import tempfile
import time

import pytest

from relayrl.config import load_config
from relayrl.errors import RoleFailure
from relayrl.placement.sections import learner_settings
from relayrl.sync.endpoints import WeightSink
from relayrl.sync.remote import free_port
from relayrl.sync.transports import Manifest
from tests.unit.test_sharded_scenarios import assert_same_first_step, experience

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def ray_group():
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=tempfile.mkdtemp(prefix="lr", dir="/tmp"),  # short: Ray's socket paths live under it
        runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}},
    )
    group = placement_group([{"CPU": 2}])
    assert group.wait(timeout_seconds=60)
    yield group
    remove_placement_group(group)
    ray.shutdown()


def config(model_dir, ranks):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "rollout.n=4",
            "rollout.prompts_per_step=4",
            "train.lr=1e-3",
            "train.micro_batch=4",
            "rollout.engine=vllm",
            "placement.mode=ray",
            f"placement.learner_ranks={ranks}",
            f"placement.call_timeout_s={CALL_TIMEOUT_S}",
        ],
    )


class Sink(WeightSink):
    """A weight receiver that keeps what it was sent (an engine's side of the sync, without the engine)."""

    def __init__(self):
        self.loaded = {}

    def load_weights(self, named_tensors, version):
        self.loaded = {name: tensor.clone() for name, tensor in named_tensors}

    def weights(self):
        return self.loaded


def test_two_rank_actors_train_sync_and_fail_by_name(random_model_dir, ray_group):
    import ray

    from relayrl.learner.role import LearnerRole
    from relayrl.placement.cluster import Slot
    from relayrl.placement.learner_ranks import start_learner_ranks
    from relayrl.sync.transports import make_receiver

    ranks = start_learner_ranks(config(random_model_dir, 2), ray_group, [Slot("learner", 0, 2.0, 2, "0,1")])
    exp = experience()
    result = ranks.update(0, ranks.prepare(exp), 10)  # a step logging its first 10 rows: 8 of rank 0's, 2 of rank 1's
    single = LearnerRole(learner_settings(config(random_model_dir, 1)))
    before = {n: p.detach().clone() for n, p in single.policy.model.named_parameters()}
    expected = single.update(0, single.prepare(experience()), 10)
    after = {n: p.detach() for n, p in single.policy.model.named_parameters()}
    stats = result.metrics
    assert stats["loss/policy"] == pytest.approx(expected.metrics["loss/policy"], rel=1e-5, abs=1e-7)
    assert stats["actor/grad_norm"] == pytest.approx(expected.metrics["actor/grad_norm"], rel=1e-5)
    assert result.sample_logprobs is not None and expected.sample_logprobs is not None
    assert len(result.sample_logprobs) == len(expected.sample_logprobs) == 10  # the ranks' shares, in batch order
    for row, (got, want) in enumerate(zip(result.sample_logprobs, expected.sample_logprobs)):
        trained = exp.loss_mask[row].nonzero().flatten().tolist()
        assert [got[c] for c in trained] == pytest.approx([want[c] for c in trained], abs=1e-4)

    layout = ranks.weight_layout(0.02, "fp32")
    ranks.open_sender("object_store", layout, True, 60.0, "", None)
    manifest = ranks.send_weights(1)
    assert len(manifest.handle) == len(layout.bucket_sizes) > 4
    pushed = dict(make_receiver("object_store", layout).receive(manifest))
    assert_same_first_step(pushed, after, before)

    sink = ray.remote(Sink).options(num_cpus=0).remote()
    port = free_port()
    joined = [ranks.submit("join_sync_group", "127.0.0.1", port, 2, 60.0)]
    ray.get(sink.join_sync_group.remote("127.0.0.1", port, 1, 2, 60.0), timeout=60)
    ranks.wait(joined[0], "joining the sync group")
    ranks.open_sender("broadcast", layout, True, 60.0, "", None)
    ray.get(sink.open_receiver.remote("broadcast", layout, True, 60.0), timeout=60)
    sent, received = ranks.submit("send_weights", 2), sink.receive_weights.remote(Manifest(2, None))
    ranks.wait(sent, "sending weights")
    ray.get(received, timeout=60)
    pushed = ray.get(sink.weights.remote(), timeout=60)
    assert_same_first_step(pushed, after, before)

    ray.kill(ranks.actors[1], no_restart=True)
    start = time.monotonic()
    with pytest.raises(RoleFailure, match=r"learner rank 1 \(actor \w+\) died during update"):
        ranks.update(1, exp)
    assert time.monotonic() - start < CALL_TIMEOUT_S + 30
    for actor in ranks.actors:
        ray.kill(actor, no_restart=True)
