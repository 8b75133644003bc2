"""What a deployment or a change would cost before it is made (issue 19, item 3): its
replicas, GPUs and KV blocks against what the tenant's other live deployments hold and its
quota, and whether the cluster as it is can place its replicas. Read-only: the same spec
cleaning, quota reading (`quota_usage`, the GPU memory cap per replica) and placement as
`deployment_create` and `deployment_change` (check_quota, capacity.check_fits), without
writing anything; a setting that would be refused comes back as that refusal."""

from __future__ import annotations

from typing import Any

from portal.exceptions import ConflictError
from serving.deployments import capacity
from serving.deployments.models import Deployment, KvMode
from serving.deployments.replica_memory import check_replica_memory
from serving.deployments.services.revisions import changed_spec
from serving.deployments.services.spec import new_deployment_spec, quota_usage, spec_usage
from serving.registry.selectors import version_get_deployable
from tenants.models import Tenant

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
    return _cost(tenant=tenant, spec=spec, deployment=None)


def deployment_change_cost(
    *, tenant: Tenant, deployment: Deployment, changes: dict[str, Any]
) -> dict[str, Any]:
    """The preview of `deployment_change(changes=...)` (scale, canary): what the deployment
    holds now and after, against its quota with the other deployments, and whether the
    cluster can place what it adds."""
    current = deployment.current_revision
    if current is None:
        raise ConflictError("this deployment has no revision.", field="deployment")
    spec = changed_spec(tenant=tenant, current=current, changes=changes)
    return _cost(tenant=tenant, spec=spec, deployment=deployment)


def _cost(*, tenant: Tenant, spec: dict[str, Any], deployment: Deployment | None) -> dict[str, Any]:
    usage = quota_usage(tenant=tenant, spec=spec, replacing=deployment)
    quota = usage.quota
    # A replica over the tenant's GPU memory cap is refused whatever the totals: that refusal.
    check_replica_memory(quota=quota, spec=spec)
    current = deployment.current_revision if deployment is not None else None
    before = spec_usage(spec=current.spec()) if current is not None else None
    rows = [_row("deployments", "Deployments", 1, usage.count, quota.max_deployments)]
    for key, label, limit_name in RESOURCES:
        limit = int(getattr(quota, limit_name))
        rows.append(_row(key, label, usage.this[key], usage.others[key], limit))
        rows[-1]["before"] = before[key] if before is not None else None
    rows[0]["before"] = 1 if before is not None else None
    return {
        "rows": rows,
        "fits_quota": not any(r["over"] for r in rows),
        "cluster": _placement(spec, current.spec() if current is not None else None, deployment),
        "shared": spec["kv_mode"] == KvMode.SHARED,
        "change": deployment is not None,
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


def _placement(
    spec: dict[str, Any], current: dict[str, Any] | None, deployment: Deployment | None
) -> dict[str, Any]:
    """Whether the cluster as it is can place the replicas (those of `current`, the revision
    a change replaces, given back): known, fits, and Ray's words."""
    asks = capacity.replica_asks(spec)
    if not asks:
        return {"known": True, "fits": True, "said": "a shared pool's replicas are the platform's"}
    if current is not None and not capacity.grows(capacity.replica_asks(current), asks):
        return {"known": True, "fits": True, "said": "it asks for no more than it holds now"}
    cluster = capacity.cluster_capacity()
    if cluster is None:
        return {"known": False, "fits": None, "said": "Ray cannot say right now"}
    if cluster.autoscales:
        return {"known": True, "fits": True, "said": "the cluster autoscales: it waits for a node"}
    held = capacity.held_by(deployment, current) if deployment and current else {}
    short = capacity.place_replicas(cluster, asks, held=held)
    if short is not None:
        return {"known": True, "fits": False, "said": short.describe()}
    return {"known": True, "fits": True, "said": "the cluster as it is can place its replicas"}
