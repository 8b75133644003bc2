"""The platform's view for staff (issue 19, item 1): the fleet by node (Ray's resources in use
and free on each, the GPU agent reporting from it), the deployments of every tenant by state,
the last reconcile runs and the deployments drifting from what Serve runs now. Composition
(the top of the portal app): it reads serving through its public selectors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Count

from serving.deployments import capacity
from serving.deployments.models import Deployment, ReconcileRun
from serving.telemetry import agent as gpu_agent
from tenants.models import Tenant

RECENT_RUNS = 10


def _nodes() -> dict[str, Any]:
    cluster = capacity.cluster_capacity()
    if cluster is None:
        return {"known": False, "rows": []}
    rows = [_node_row(node) for node in cluster.nodes]
    return {
        "known": True,
        "rows": rows,
        "summary": cluster.summary(),
        "autoscales": cluster.autoscales,
        "pending": [{"shape": dict(shape), "count": n} for shape, n in cluster.pending],
    }


def _node_row(node: Any) -> dict[str, Any]:
    def pair(resource: str) -> tuple[float, float]:
        return node.used.get(resource, 0.0), node.total.get(resource, 0.0)

    return {
        "node": node.node_id[:12],
        "cpu": pair("CPU"),
        "gpu": pair("GPU"),
        "memory": pair("memory"),
        "cpu_width": _width(*pair("CPU")),
    }


def _width(used: float, total: float) -> float:
    return round(min(1.0, used / total) * 100, 1) if total else 0.0


def _drifting() -> list[dict[str, Any]]:
    """Deployments whose Serve config drifts now (the drift check's state), with their tenant."""
    import redis

    try:
        client = redis.Redis.from_url(settings.REDIS_URL)
        raw = client.hgetall(f"{settings.SLI_KEY_PREFIX}:drift")
    except redis.RedisError:
        return []
    states = {int(k): json.loads(v) for k, v in raw.items()}
    current = {pk: s for pk, s in states.items() if not s.get("repaired_at")}
    for state in current.values():
        state["since"] = datetime.fromtimestamp(float(state.get("detected_at") or 0), tz=UTC)
    deployments = Deployment.objects.filter(pk__in=current).select_related("tenant")
    return [{"d": d, "state": current[d.pk]} for d in deployments.order_by("tenant__slug", "name")]


def fleet() -> dict[str, Any]:
    by_status = dict(
        Deployment.objects.filter(deleted_at__isnull=True)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    try:
        agents = gpu_agent.agents_status()
    except Exception:  # Redis away: the page says so
        agents = None
    return {
        "nodes": _nodes(),
        "agents": agents,
        "by_status": sorted(by_status.items()),
        "deployments": sum(by_status.values()),
        "tenants": Tenant.objects.filter(is_active=True).count(),
        "runs": list(ReconcileRun.objects.all()[:RECENT_RUNS]),
        "drifting": _drifting(),
    }
