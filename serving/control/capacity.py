"""What the cluster has free, and whether a deployment's replicas fit in it.

Read from Ray's own accounting (the dashboard's `/api/cluster_status`: per node, each logical
resource as [used, total]; the demands Ray cannot place yet). A replica asks Ray for its
`num_cpus` / `num_gpus` (memory is not reserved: it is shown, never checked). Placement is
decided per node, the way Ray's scheduler does it: a replica of 1.5 CPUs does not fit on a
cluster of two nodes with 1 CPU free each, though 2 CPUs are free in all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The scheduling resources a deployment asks for, and the setting that asks for each.
RESOURCES = {"CPU": "num_cpus", "GPU": "num_gpus"}
_EPSILON = 1e-9


@dataclass(frozen=True)
class NodeCapacity:
    node_id: str
    total: Mapping[str, float]
    used: Mapping[str, float]

    def free(self, resource: str) -> float:
        return max(0.0, self.total.get(resource, 0.0) - self.used.get(resource, 0.0))


@dataclass(frozen=True)
class ClusterCapacity:
    nodes: tuple[NodeCapacity, ...]
    # What Ray cannot place now: (resources of one request, how many such requests).
    pending: tuple[tuple[Mapping[str, float], int], ...] = ()
    autoscales: bool = False

    def total(self, resource: str) -> float:
        return sum(n.total.get(resource, 0.0) for n in self.nodes)

    def used(self, resource: str) -> float:
        return sum(n.used.get(resource, 0.0) for n in self.nodes)

    def free(self, resource: str) -> float:
        return sum(n.free(resource) for n in self.nodes)

    def summary(self) -> dict[str, Any]:
        """What a page or the API shows: CPU, GPU and memory (bytes) in use and free."""

        def one(resource: str) -> dict[str, float]:
            return {
                "total": round(self.total(resource), 4),
                "used": round(self.used(resource), 4),
                "free": round(self.free(resource), 4),
            }

        return {
            "nodes": len(self.nodes),
            "cpu": one("CPU"),
            "gpu": one("GPU"),
            "memory_bytes": one("memory"),
            "pending": [
                {"resources": dict(shape), "count": count} for shape, count in self.pending
            ],
            "autoscales": self.autoscales,
        }


def parse_cluster_status(raw: Mapping[str, Any], *, autoscales: bool = False) -> ClusterCapacity:
    """The dashboard's `/api/cluster_status` answer (its `data`) as a ClusterCapacity."""
    report = ((raw.get("clusterStatus") or {}).get("loadMetricsReport")) or {}
    nodes = []
    for node_id, usage in sorted((report.get("usageByNode") or {}).items()):
        total, used = {}, {}
        for name, pair in (usage or {}).items():
            if isinstance(pair, list | tuple) and len(pair) == 2:
                used[name], total[name] = float(pair[0]), float(pair[1])
        nodes.append(NodeCapacity(node_id=str(node_id), total=total, used=used))
    pending = [
        ({str(k): float(v) for k, v in entry[0].items()}, int(entry[1]))
        for entry in report.get("resourceDemand") or ()
        if isinstance(entry, list | tuple) and len(entry) == 2 and isinstance(entry[0], Mapping)
    ]
    return ClusterCapacity(nodes=tuple(nodes), pending=tuple(pending), autoscales=autoscales)


@dataclass(frozen=True)
class Shortfall:
    """Why replicas do not fit: the resource that ran out and the figures behind it."""

    resource: str
    replicas: int
    each: float
    free: float
    total: float
    largest_node: float

    @property
    def setting(self) -> str:
        return RESOURCES.get(self.resource, self.resource)

    def describe(self) -> str:
        unit = self.resource
        need = f"{self.replicas} replica(s) x {self.each:g} {unit} = {self.replicas * self.each:g}"
        said = f"it needs {need}; the cluster has {self.free:g} of {self.total:g} {unit} free"
        if self.each > self.largest_node + _EPSILON:
            said += f", and no node has {self.each:g} {unit} for one replica"
        return said


def place(
    cluster: ClusterCapacity,
    replicas: Sequence[Mapping[str, float]],
    *,
    held: Mapping[str, Mapping[str, float]] | None = None,
) -> Shortfall | None:
    """None when every replica (its resources) fits on the cluster's nodes, first fit from the
    largest, counting as free what `held` (node id -> resources) gives back: the replicas the
    new ones replace. Else the resource that ran out, with the figures."""
    held = held or {}
    free = {
        n.node_id: {r: n.free(r) + held.get(n.node_id, {}).get(r, 0.0) for r in RESOURCES}
        for n in cluster.nodes
    }
    before = {r: sum(f[r] for f in free.values()) for r in RESOURCES}
    largest = {r: max((f[r] for f in free.values()), default=0.0) for r in RESOURCES}
    asks = [{r: float(replica.get(r, 0.0)) for r in RESOURCES} for replica in replicas]
    for asked in sorted(asks, key=lambda a: tuple(-a[r] for r in RESOURCES)):
        node = next(
            (f for f in free.values() if all(f[r] + _EPSILON >= asked[r] for r in RESOURCES)),
            None,
        )
        if node is not None:
            for r in RESOURCES:
                node[r] -= asked[r]
            continue
        # The resource no node has enough of; else (two resources on different nodes, or the
        # count) the scarcest one this replica asks for.
        wanted = [r for r in RESOURCES if asked[r] > 0] or ["CPU"]
        short = [r for r in wanted if not any(f[r] + _EPSILON >= asked[r] for f in free.values())]
        resource = (short or sorted(wanted, key=lambda r: before[r] / max(asked[r], _EPSILON)))[0]
        return Shortfall(
            resource=resource,
            replicas=sum(1 for a in asks if math.isclose(a[resource], asked[resource])),
            each=asked[resource],
            free=round(before[resource], 4),
            total=round(cluster.total(resource), 4),
            largest_node=round(largest[resource], 4),
        )
    return None
