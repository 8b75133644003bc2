"""What a new deployment would cost before it is made (issue 19, item 3): its replicas, GPUs
and KV blocks against what the tenant's other live deployments hold and its quota, and
whether the cluster as it is can place its replicas. Read-only: the same spec cleaning,
usage rule and placement as `deployment_create` (check_quota, capacity.check_fits), without
writing anything; a setting that would be refused comes back as that refusal."""

from __future__ import annotations

from typing import Any

from serving.deployments import capacity
from serving.deployments.models import KvMode
from serving.deployments.services.spec import live_deployments, new_deployment_spec, spec_usage
from serving.registry.selectors import version_get_deployable
from tenants.models import Quota, Tenant

RESOURCES = (
    ("replicas", "Replicas", "max_replicas"),
    ("gpus", "GPUs", "max_gpus"),
    ("kv_blocks", "KV-cache blocks", "max_kv_blocks"),
)


def new_deployment_cost(
    *, tenant: Tenant, version_id: Any, settings: dict[str, Any]
) -> dict[str, Any]:
    """The preview of `deployment_create(version_id=..., settings=...)`; raises what it would
    raise for a setting that makes no sense (ValidationFailed naming the field)."""
    version = version_get_deployable(tenant=tenant, version_id=version_id, field="version")
    spec = new_deployment_spec(tenant=tenant, version=version, settings=settings, key_hashes=[])
    quota = Quota.objects.get(tenant=tenant)
    others = {key: 0.0 for key, _, _ in RESOURCES}
    live = list(live_deployments(tenant=tenant).select_related("current_revision"))
    for other in live:
        if other.current_revision is not None:
            for key, value in spec_usage(spec=other.current_revision.spec()).items():
                others[key] += value
    this = spec_usage(spec=spec)
    rows = [_row("deployments", "Deployments", 1, len(live), quota.max_deployments)]
    for key, label, limit_name in RESOURCES:
        rows.append(_row(key, label, this[key], others[key], int(getattr(quota, limit_name))))
    return {
        "rows": rows,
        "fits_quota": not any(r["over"] for r in rows),
        "cluster": _placement(spec),
        "shared": spec["kv_mode"] == KvMode.SHARED,
    }


def _row(key: str, label: str, this: float, others: float, limit: int) -> dict[str, Any]:
    after = others + this
    share = after / limit if limit else 1.0
    return {
        "key": key,
        "label": label,
        "this": this,
        "others": others,
        "after": after,
        "limit": limit,
        "over": after > limit,
        "width": round(min(1.0, share) * 100, 1),
    }


def _placement(spec: dict[str, Any]) -> dict[str, Any]:
    """Whether the cluster as it is can place the replicas: known, fits, and Ray's words."""
    asks = capacity.replica_asks(spec)
    if not asks:
        return {"known": True, "fits": True, "said": "a shared pool's replicas are the platform's"}
    cluster = capacity.cluster_capacity()
    if cluster is None:
        return {"known": False, "fits": None, "said": "Ray cannot say right now"}
    if cluster.autoscales:
        return {"known": True, "fits": True, "said": "the cluster autoscales: it waits for a node"}
    short = capacity.place_replicas(cluster, asks, held={})
    if short is not None:
        return {"known": True, "fits": False, "said": short.describe()}
    return {"known": True, "fits": True, "said": "the cluster as it is can place its replicas"}
