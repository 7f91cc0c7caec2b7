"""Placement logic without a cluster: shares across replicas, bundles and cores per role, messages."""

import pytest

from relayrl.config import PlacementConfig
from relayrl.placement.cluster import check_fits, plan_slots, unplaceable_message
from relayrl.placement.engines import split
from relayrl.placement.handles import root_cause


def test_split_gives_contiguous_even_shares_with_their_offsets():
    assert split(list("abcdefg"), 3) == [(0, list("abc")), (3, list("de")), (5, list("fg"))]
    assert split(list("ab"), 3) == [(0, ["a"]), (1, ["b"]), (2, [])]
    shares = split(list(range(32)), 4)
    assert [x for _, share in shares for x in share] == list(range(32))  # order kept: seeds line up


def test_disaggregated_roles_get_their_own_bundles_and_cores():
    bundles, slots = plan_slots(PlacementConfig(mode="ray", engines=2, learner_cpus=2, engine_cpus=1), 4)
    assert bundles == [{"CPU": 2}, {"CPU": 1}, {"CPU": 1}]
    assert [(s.role, s.bundle, s.threads, s.cores) for s in slots] == [
        ("learner", 0, 2, "0,1"),
        ("engine 0", 1, 1, "2"),
        ("engine 1", 2, 1, "3"),
    ]


def test_colocated_roles_share_one_bundle_and_every_core():
    bundles, slots = plan_slots(
        PlacementConfig(mode="ray", layout="colocated", engines=1, learner_cpus=2, engine_cpus=2), 2
    )
    assert bundles == [{"CPU": 2}]
    assert {s.bundle for s in slots} == {0} and all(s.cpus == 1 and s.cores == "0-1" for s in slots)


def test_unplaceable_message_names_roles_and_resources():
    placement = PlacementConfig(mode="ray", engines=4, placement_timeout_s=3)
    bundles, _ = plan_slots(placement, 2)
    text = unplaceable_message(placement, bundles, {"CPU": 2.0}, {"CPU": 1.0})
    assert "within 3 s" in text and "learner {CPU: 1} + 4 engine(s) {CPU: 1} each = 5 CPUs" in text
    assert "cluster has 2 CPUs (1 free)" in text and "placement.layout=colocated" in text


def test_root_cause_keeps_the_informative_part_on_one_line():
    err = RuntimeError(
        "ActorDiedError: boilerplate\n  more\nThe actor died because its worker process\n  exited with SIGKILL."
    )
    assert root_cause(err) == "The actor died because its worker process exited with SIGKILL."


def test_a_placement_larger_than_the_cluster_fails_before_ray_is_asked(monkeypatch):
    import relayrl.placement.cluster as cluster
    from relayrl.config import Config
    from relayrl.errors import PlacementError

    def no_ray(placement):
        raise AssertionError("Ray was started for a placement that cannot fit")

    monkeypatch.setattr(cluster, "start_ray", no_ray)
    config = Config(placement=PlacementConfig(mode="ray", engines=2, num_cpus=2, placement_timeout_s=74))
    with pytest.raises(PlacementError) as raised:
        cluster.reserve(config)
    text = str(raised.value)
    assert "2 engine(s)" in text and "= 3 CPUs" in text and "cluster has 2 CPUs" in text
    assert "Lower placement.engines" in text


def test_check_fits_accepts_what_the_cluster_holds():
    from relayrl.errors import PlacementError

    placement = PlacementConfig(mode="ray", engines=1)
    bundles, _ = plan_slots(placement, 2)
    check_fits(placement, bundles, {"CPU": 2.0}, {"CPU": 0.0})  # busy now, but it fits once the cluster frees up
    with pytest.raises(PlacementError, match="cluster has 1 CPUs"):
        check_fits(placement, bundles, {"CPU": 1.0}, {"CPU": 1.0})
