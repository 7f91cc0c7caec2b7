"""A process already connected to one Ray cluster, asked to run on another (`placement.address`), joins the one asked
for; with no address (or `auto`) it keeps the cluster it has (a previous run's, or the user's own `ray.init`)."""

import pytest

from relayrl.config import load_config
from relayrl.placement.cluster import leave_ray, start_ray
from relayrl.placement.ray_head import start_head


@pytest.fixture
def two_heads():
    first, second = start_head(1), start_head(1)
    yield first.address, second.address
    leave_ray()
    first.stop()
    second.stop()


def joined_port() -> str:
    """The port of the head this process is connected to (Ray names the host by the node's IP, the head by 127.0.0.1)."""
    import ray

    return ray.get_runtime_context().gcs_address.rpartition(":")[2]


def placement(address: str):
    return load_config(None, ["placement.mode=ray", f"placement.address={address}"]).placement


def test_a_run_naming_another_cluster_leaves_the_one_it_is_connected_to(two_heads):
    first, second = two_heads
    start_ray(placement(first))
    assert joined_port() == first.rpartition(":")[2]
    start_ray(placement(first))  # the same head by the same name: stays
    start_ray(placement("auto"))  # any cluster will do: keeps the first
    assert joined_port() == first.rpartition(":")[2]
    start_ray(placement(second))
    assert joined_port() == second.rpartition(":")[2]
