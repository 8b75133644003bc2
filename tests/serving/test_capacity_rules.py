"""Admission's arithmetic (no cluster needed): what a revision's replicas ask Ray for, which
changes ask for more, the setting a refusal names, and Ray's reason for replicas that wait."""

from __future__ import annotations

from typing import Any

from serving.control.capacity import Shortfall, parse_cluster_status
from serving.deployments.capacity import _setting, grows, replica_asks, waiting_reason

BASE: dict[str, Any] = {
    "kv_mode": "dedicated", "num_replicas": 2, "autoscaling": None, "num_cpus": 0.5,
    "num_gpus": 0.0, "canary_version_id": None,
}  # fmt: skip


def test_a_revision_asks_per_replica_of_its_router_and_of_its_canary() -> None:
    assert replica_asks(BASE) == [{"CPU": 0.5, "GPU": 0.0}] * 2
    assert len(replica_asks({**BASE, "canary_version_id": 9})) == 4
    scaling = {"min_replicas": 1, "max_replicas": 8, "initial_replicas": 3}
    assert len(replica_asks({**BASE, "autoscaling": scaling})) == 3  # what starts
    assert replica_asks({**BASE, "kv_mode": "shared"}) == []  # the pool is the platform's
    assert replica_asks(None) == []


def test_only_a_change_that_asks_for_more_is_checked() -> None:
    now = replica_asks(BASE)
    assert not grows(now, replica_asks({**BASE, "num_replicas": 1}))  # scale down
    assert not grows(replica_asks({**BASE, "canary_version_id": 9}), now)  # a rollback
    assert grows(now, replica_asks({**BASE, "num_replicas": 3}))
    assert grows(now, replica_asks({**BASE, "num_cpus": 1.0, "num_replicas": 1}))  # bigger one
    assert grows(now, replica_asks({**BASE, "num_gpus": 1.0}))
    assert grows([], now)  # a new deployment


def test_the_refusal_names_what_the_change_raised() -> None:
    def short(each: float, largest: float, resource: str = "CPU") -> Shortfall:
        return Shortfall(resource=resource, replicas=2, each=each, free=1, total=2,
                         largest_node=largest)  # fmt: skip

    assert _setting(short(3, 2), BASE, None) == "num_cpus"  # no node takes one replica
    assert _setting(short(3, 2, "GPU"), BASE, BASE) == "num_gpus"
    assert _setting(short(0.5, 1), {**BASE, "num_replicas": 9}, None) == "num_replicas"
    assert _setting(short(0.5, 1), {**BASE, "canary_version_id": 9}, BASE) == "canary_version"
    assert _setting(short(0.75, 1), {**BASE, "num_cpus": 0.75}, BASE) == "num_cpus"
    assert _setting(short(0.5, 1), {**BASE, "num_replicas": 9}, BASE) == "num_replicas"
    scaled = {**BASE, "autoscaling": {"min_replicas": 9, "max_replicas": 9}}
    assert _setting(short(0.5, 1), scaled, BASE) == "autoscaling"


def test_rays_reason_is_told_only_for_demands_of_the_deployments_shape() -> None:
    status = {"clusterStatus": {"loadMetricsReport": {
        "usageByNode": {"n1": {"CPU": [1.5, 2.0]}},
        "resourceDemand": [[{"CPU": 0.5}, 3]],
    }}}  # fmt: skip
    cluster = parse_cluster_status(status)
    said = waiting_reason(cluster, BASE, 2)
    assert said == (
        "Ray cannot place 2 replica(s) asking for 0.5 CPU each: the cluster has 0.5 of 2 CPU "
        "free and does not autoscale: scale down or free capacity."
    )  # its own count (2), never the cluster's 3 pending (another deployment's among them)
    assert waiting_reason(cluster, {**BASE, "num_cpus": 1.0}, 2) == ""  # not its shape
    assert waiting_reason(cluster, BASE, 0) == ""  # nothing of its own waits
    assert waiting_reason(None, BASE, 2) == ""  # Ray cannot say
    autoscaling = parse_cluster_status(status, autoscales=True)
    assert waiting_reason(autoscaling, BASE, 1).endswith(
        "waiting for the autoscaler to add a node."
    )
