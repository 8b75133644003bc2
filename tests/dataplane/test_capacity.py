"""Ray's accounting read into per-node capacity, and replicas placed on it the way Ray's
scheduler would: per node, what a replacement gives back counted as free."""

from __future__ import annotations

from typing import Any

from serving.control.capacity import ClusterCapacity, NodeCapacity, parse_cluster_status, place

# The shape of the dashboard's /api/cluster_status `data` (Ray 2.60), two nodes.
STATUS: dict[str, Any] = {
    "clusterStatus": {
        "loadMetricsReport": {
            "usageByNode": {
                "n1": {"CPU": [1.5, 2.0], "memory": [0.0, 8e9], "node:127.0.0.1": [0.0, 1.0]},
                "n2": {"CPU": [0.0, 1.0], "GPU": [1.0, 2.0], "memory": [1e9, 4e9]},
            },
            "resourceDemand": [[{"CPU": 3.0}, 1], "junk"],
        }
    }
}


def _cpu(*each: float) -> list[dict[str, float]]:
    return [{"CPU": c, "GPU": 0.0} for c in each]


def test_the_status_reads_into_nodes_totals_and_pending_demands() -> None:
    cluster = parse_cluster_status(STATUS, autoscales=True)
    assert [n.node_id for n in cluster.nodes] == ["n1", "n2"]
    summary = cluster.summary()
    assert summary["cpu"] == {"total": 3.0, "used": 1.5, "free": 1.5}
    assert summary["gpu"] == {"total": 2.0, "used": 1.0, "free": 1.0}
    assert summary["memory_bytes"]["free"] == 11e9
    assert summary["pending"] == [{"resources": {"CPU": 3.0}, "count": 1}]
    assert summary["autoscales"] is True
    assert parse_cluster_status({}).nodes == ()  # nothing known: nothing fits


def test_replicas_are_placed_per_node_not_against_the_sum() -> None:
    cluster = parse_cluster_status(STATUS)
    assert place(cluster, _cpu(1.0, 0.5)) is None  # n2 takes 1, n1 takes 0.5
    short = place(cluster, _cpu(1.5))  # 1.5 free in all, but 0.5 and 1 on two nodes
    assert short is not None and short.resource == "CPU" and short.setting == "num_cpus"
    assert (short.each, short.free, short.total, short.largest_node) == (1.5, 1.5, 3.0, 1.0)
    assert "no node has 1.5 CPU for one replica" in short.describe()
    many = place(cluster, _cpu(0.5, 0.5, 0.5, 0.5))  # 1.5 free: the fourth has no room
    assert many is not None and many.replicas == 4 and "no node" not in many.describe()
    assert "4 replica(s) x 0.5 CPU = 2; the cluster has 1.5 of 3 CPU free" in many.describe()
    gpu = place(cluster, [{"CPU": 0.5, "GPU": 2.0}])
    assert gpu is not None and gpu.setting == "num_gpus"
    assert place(cluster, [{"CPU": 1.0, "GPU": 1.0}]) is None  # n2 has both


def test_what_the_replaced_replicas_hold_counts_as_free_on_their_node() -> None:
    cluster = parse_cluster_status(STATUS)
    assert place(cluster, _cpu(2.0)) is not None
    assert place(cluster, _cpu(2.0), held={"n1": {"CPU": 1.5}}) is None
    assert place(cluster, _cpu(2.0), held={"n2": {"CPU": 1.0}}) is None
    assert place(cluster, _cpu(2.5), held={"n2": {"CPU": 1.0}}) is not None


def test_an_empty_cluster_places_nothing_and_no_replica_always_fits() -> None:
    empty = ClusterCapacity(nodes=())
    assert place(empty, _cpu(0.25)) is not None
    assert place(empty, []) is None
    node = NodeCapacity("n", total={"CPU": 1.0}, used={"CPU": 1.0})
    assert place(ClusterCapacity(nodes=(node,)), _cpu(0.0)) is None  # num_cpus 0 asks nothing
