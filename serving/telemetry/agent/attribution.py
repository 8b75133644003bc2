"""Attribution: NVML's compute processes mapped to Ray Serve replicas (by what survives pid
namespaces: serving.dataplane.identity), so to deployments and tenants, and the view of a
sample each group is sent."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from serving.control.names import BadName, deployment_app
from serving.dataplane import identity
from serving.telemetry.keys import node_group, tenant_group
from serving.telemetry.providers.base import GpuProcess


@dataclass(frozen=True)
class Owner:
    """Who a replica serves: the deployment (and its tenant) behind a Serve app."""

    tenant_id: int
    tenant: str
    deployment_id: int
    deployment: str


def replicas_by_pid(snapshots: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """The replicas' published SLI snapshots by the pid each reported (os.getpid())."""
    out: dict[int, Mapping[str, Any]] = {}
    for snapshot in snapshots:
        pid = snapshot.get("pid")
        if isinstance(pid, int) and pid > 0:
            out[pid] = snapshot
    return out


def _identity(pid: int) -> tuple[str, int] | None:
    """(pid namespace, pid inside it) of a process NVML reports, read from this agent's /proc;
    None when the process is not visible here (the agent runs in another pid namespace)."""
    namespace, inner = identity.pid_namespace(pid), identity.innermost_pid(pid)
    return (namespace, inner) if namespace and inner else None


def match_replicas(
    processes: Iterable[GpuProcess],
    replicas: Iterable[Mapping[str, Any]],
    identify: Callable[[int], tuple[str, int] | None] = _identity,
) -> dict[int, Mapping[str, Any]]:
    """NVML pid -> the replica it is. First by what survives pid namespaces: the process's
    namespace and its pid in there, as the replica published them (a replica in a container,
    an agent on the host). Then by the same pid where the replica published no namespace or
    the agent cannot read the process (one namespace for both). Last, a device that exactly one
    replica says it uses and exactly one unmatched process holds is that replica's."""
    processes, replicas = list(processes), list(replicas)
    by_identity = {
        (str(r["pidns"]), int(r["pid"])): r
        for r in replicas
        if r.get("pidns") and isinstance(r.get("pid"), int)
    }
    by_pid = replicas_by_pid(replicas)
    own = identity.pid_namespace()
    out: dict[int, Mapping[str, Any]] = {}
    for process in processes:
        key = identify(process.pid)
        found = by_identity.get(key) if key is not None else None
        same_pid = by_pid.get(process.pid)
        if found is None and same_pid is not None:
            # A pid is only the same process in the same namespace: a replica that published
            # none (older), or one in this agent's own namespace whose process it cannot read.
            namespace = same_pid.get("pidns")
            if not namespace or (key is None and namespace == own):
                found = same_pid
        if found is not None:
            out[process.pid] = found
    matched = {id(r) for r in out.values()}
    for device in {p.device_uuid for p in processes}:
        left = [p for p in processes if p.device_uuid == device and p.pid not in out]
        uuid = identity.gpu_uuid(device)
        claims = [r for r in replicas if id(r) not in matched and uuid in (r.get("gpus") or [])]
        if len(left) == 1 and len(claims) == 1:
            out[left[0].pid] = claims[0]
            matched.add(id(claims[0]))
    return out


def attribute(
    processes: Iterable[GpuProcess],
    replicas: Iterable[Mapping[str, Any]],
    owners: Mapping[str, Owner],
    identify: Callable[[int], tuple[str, int] | None] = _identity,
) -> list[dict[str, Any]]:
    """Each NVML compute process, with the replica, deployment and tenant it belongs to
    (match_replicas; `tenant_id` None: not a portal replica, shown to operators only)."""
    processes = list(processes)
    matched = match_replicas(processes, replicas, identify)
    out = []
    for process in processes:
        replica = matched.get(process.pid)
        owner = owners.get(str(replica.get("app"))) if replica is not None else None
        row: dict[str, Any] = {
            **process.to_dict(),
            "tenant_id": None,
            "tenant": None,
            "deployment_id": None,
            "deployment": None,
            "group": None,
            "replica": None,
        }
        if replica is not None and owner is not None:
            row.update(
                tenant_id=owner.tenant_id,
                tenant=owner.tenant,
                deployment_id=owner.deployment_id,
                deployment=owner.deployment,
                group=replica.get("group"),
                replica=replica.get("replica"),
            )
        out.append(row)
    return out


def kv_of(snapshot: Mapping[str, Any], tenant_id: int) -> dict[str, Any]:
    """One replica's KV cache as the dashboard shows it: usage, the tenant's prefix hit rate,
    fragmentation (1 - largest free run / free blocks)."""
    kv = snapshot.get("kv") or {}
    total = int(kv.get("num_blocks", 0))
    free = int(kv.get("free_blocks", 0))
    mine = (kv.get("tenants") or {}).get(str(tenant_id), {})
    queries = int(mine.get("prefix_queries", 0))
    return {
        "replica": snapshot.get("replica"),
        "group": snapshot.get("group"),
        "blocks_total": total,
        "blocks_used": total - free,
        "usage": round((total - free) / total, 4) if total else 0.0,
        "prefix_queries": queries,
        "prefix_hits": int(mine.get("prefix_hits", 0)),
        "prefix_hit_rate": round(int(mine.get("prefix_hits", 0)) / queries, 4) if queries else None,
        "fragmentation": float(kv.get("fragmentation", 0.0)),
        "preemptions": int(mine.get("preemptions", 0)),
    }


def views(
    snapshot: Mapping[str, Any],
    replicas: Iterable[Mapping[str, Any]],
    owners: Mapping[str, Owner],
) -> dict[str, dict[str, Any]]:
    """What each group is sent: the node group everything, each tenant group only the devices
    its processes use, its own processes and its deployments' KV caches."""
    devices = snapshot["devices"]
    processes = snapshot["processes"]
    head = {k: snapshot[k] for k in ("at", "node", "simulated", "provider")}
    out: dict[str, dict[str, Any]] = {
        node_group(snapshot["node"]): {**head, "devices": devices, "processes": processes}
    }
    tenants = {p["tenant_id"] for p in processes if p["tenant_id"] is not None}
    kv: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for replica in replicas:
        owner = owners.get(str(replica.get("app")))
        if owner is not None:
            tenants.add(owner.tenant_id)
            kv.setdefault(owner.tenant_id, {}).setdefault(owner.deployment, []).append(
                kv_of(replica, owner.tenant_id)
            )
    for tenant_id in sorted(tenants):
        mine = [p for p in processes if p["tenant_id"] == tenant_id]
        used = {p["device_uuid"] for p in mine}
        out[tenant_group(tenant_id)] = {
            **head,
            "devices": [d for d in devices if d["uuid"] in used],
            "processes": [
                {
                    k: p[k]
                    for k in (
                        "device_index",
                        "device_uuid",
                        "used_memory",
                        "deployment",
                        "group",
                        "replica",
                    )
                }
                for p in mine
            ],
            "kv": kv.get(tenant_id, {}),
        }
    return out


def owners_map() -> dict[str, Owner]:
    """Serve app name (`<tenant slug>.<deployment>`) -> owner, for every live deployment."""
    from serving.deployments.models import Deployment

    rows = Deployment.objects.filter(deleted_at__isnull=True).values_list(
        "tenant_id", "tenant__slug", "pk", "name"
    )
    owners = {}
    for tenant_id, slug, pk, name in rows:
        with contextlib.suppress(BadName):  # never compiled, so no replica publishes it
            owners[deployment_app(slug, name)] = Owner(tenant_id, slug, pk, name)
    return owners
