"""The placement and address rules of the Ray backend (pure functions, no cluster)."""

from __future__ import annotations

import pytest

from shipyard.backends.ray.placement import (
    NodeInfo,
    demand,
    instance_addresses,
    plan_placement,
)
from shipyard.errors import ValidationError

HOSTS = ["algo-1", "algo-2", "algo-3"]
LOOPBACK = {"algo-1": "127.150.3.1", "algo-2": "127.150.3.2", "algo-3": "127.150.3.3"}


def nodes(*specs):
    return [NodeInfo(f"n{i}", ip, cpus, gpus) for i, (ip, cpus, gpus) in enumerate(specs)]


def test_instance_type_resources_are_the_types_not_this_machines():
    assert (demand("ml.m5.xlarge").cpus, demand("ml.m5.xlarge").gpus) == (4, 0)
    assert (demand("ml.p3.2xlarge").cpus, demand("ml.p3.2xlarge").gpus) == (8, 1)
    assert (demand("local").cpus, demand("local").whole_node) == (1, True)


def test_one_bundle_per_instance_strict_spread_on_machines_of_their_own():
    p = plan_placement(
        nodes(("10.0.0.1", 8, 0), ("10.0.0.2", 8, 0), ("10.0.0.3", 8, 0)),
        3,
        demand("ml.m5.xlarge"),
        "x",
    )
    assert p.strategy == "STRICT_SPREAD" and not p.one_machine
    assert p.bundles == [{"CPU": 4.0}] * 3


def test_a_machine_with_two_raylets_gets_bundles_pinned_to_distinct_ips():
    p = plan_placement(
        nodes(("10.0.0.1", 8, 0), ("10.0.0.1", 8, 0), ("10.0.0.2", 4, 0)),
        2,
        demand("ml.m5.xlarge"),
        "x",
    )
    assert sorted(k for b in p.bundles for k in b if k.startswith("node:")) == [
        "node:10.0.0.1",
        "node:10.0.0.2",
    ]


def test_one_machine_cluster_shares_it_with_loopback_addresses():
    p = plan_placement(nodes(("10.0.0.1", 4, 0)), 3, demand("local"), "x")
    assert (p.strategy, p.one_machine) == ("SPREAD", True)
    assert instance_addresses(HOSTS, ["10.0.0.1"] * 3, LOOPBACK) == LOOPBACK


def test_node_addresses_when_every_instance_has_its_own_machine():
    ips = ["127.0.0.12", "127.0.0.13", "127.0.0.14"]
    assert instance_addresses(HOSTS, ips, LOOPBACK) == dict(zip(HOSTS, ips))
    with pytest.raises(ValidationError, match="fixed ports would collide"):
        instance_addresses(HOSTS, ["10.0.0.1", "10.0.0.1", "10.0.0.2"], LOOPBACK)


@pytest.mark.parametrize(
    "cluster, count, itype, message",
    [
        (
            (("10.0.0.1", 2, 0), ("10.0.0.2", 2, 0)),
            3,
            "local",
            r"needs 3 instance\(s\) of 'local' \(1 CPU\(s\), 0 GPU\(s\) each.*2 machine\(s\).*2 of which fit",
        ),
        (
            (("10.0.0.1", 2, 0), ("10.0.0.2", 2, 0)),
            2,
            "ml.m5.xlarge",
            r"4 CPU\(s\), 0 GPU\(s\) each.*0 of which fit.*largest node has 2 CPU\(s\)",
        ),
        (
            (("10.0.0.1", 8, 0), ("10.0.0.2", 8, 0)),
            2,
            "ml.p3.2xlarge",
            r"1 GPU\(s\) each.*0 of which fit",
        ),
        ((("10.0.0.1", 2, 0),), 3, "ml.m5.large", r"one machine offer 2 CPU\(s\)"),
    ],
)
def test_too_small_a_cluster_is_refused_saying_how_many(cluster, count, itype, message):
    with pytest.raises(ValidationError, match=message):
        plan_placement(nodes(*cluster), count, demand(itype), "10.0.0.1:6379")
