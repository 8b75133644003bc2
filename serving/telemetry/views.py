"""The GPU dashboard of a tenant: live charts per GPU its replicas use (the /ws/gpu/ stream),
memory gauges, KV cache per deployment, deployment health and open incidents; the history of
longer ranges from PostgreSQL (JSON for the page's charts)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from redis.exceptions import RedisError

from serving.deployments import selectors as deployment_selectors
from serving.ops import health
from serving.telemetry import agent as gpu_agent
from serving.telemetry import panels
from serving.telemetry.models import GpuDeviceSample, GpuProcessSample, GpuResolution
from tenants.models import Tenant
from tenants.pages import tenant_page

GIB = 1 << 30
# name -> (seconds back, stored resolution)
HISTORY_RANGES = {
    "15m": (900, GpuResolution.SECOND),
    "1h": (3600, GpuResolution.SECOND),
    "24h": (86400, GpuResolution.MINUTE),
    "7d": (7 * 86400, GpuResolution.MINUTE),
}


def _agents() -> list[dict[str, Any]]:
    """Node agents' status without node details a tenant need not see: provider, simulated,
    the no-GPU message, liveness."""
    try:
        statuses = gpu_agent.agents_status()
    except RedisError:
        return []
    keys = ("provider", "simulated", "error", "stale", "hz")
    return [{k: s.get(k) for k in keys} for s in statuses]


@require_GET
@tenant_page()
def gpu_dashboard(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    agents = _agents()
    context = {
        "agents": agents,
        "simulated": any(a["simulated"] for a in agents),
        "no_gpu": [a["error"] for a in agents if a["error"]],
        "ranges": list(HISTORY_RANGES),
    }
    return render(request, "serving/gpu/dashboard.html", context)


@require_GET
@tenant_page()
def gpu_deployments(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The dashboard's deployments panel (htmx, every 2 s): status, health, open incidents."""
    deployments = list(deployment_selectors.deployment_list(tenant=tenant).order_by("name"))
    open_incidents = panels.deployment_counts(tenant).get("incidents", {})
    rows = []
    for deployment in deployments:
        try:
            info = health.deployment_health(deployment.pk)
        except RedisError:
            info = {}
        slots = info.get("slots") or {}
        firing = sum(len(s.get("firing") or []) for s in slots.values())
        budgets = [
            o.get("budget", {}).get("remaining")
            for s in slots.values()
            for o in (s.get("objectives") or [])
            if isinstance(o, dict) and o.get("budget")
        ]
        age = time.time() - float(info["checked_at"]) if info.get("checked_at") else None
        rows.append(
            {
                "d": deployment,
                "checked": age is not None and age < 3 * deployment.health_interval_s + 5,
                "firing": firing,
                "budget": min((b for b in budgets if b is not None), default=None),
                "probe": (info.get("probe") or {}).get("ok"),
                "incidents": open_incidents.get(deployment.pk, 0),
            }
        )
    return render(request, "serving/gpu/_deployments.html", {"rows": rows})


def memory_rows(snapshots: list[dict[str, Any]], tenant_id: int) -> list[dict[str, Any]]:
    """The devices the tenant's replicas are on, newest sample of each (30 s at most): memory,
    largest free block and fragmentation, each marked simulated where the fake provider
    made it up."""
    now = time.time()
    rows = []
    for snapshot in snapshots:
        if now - float(snapshot.get("at") or 0) > 30:
            continue
        mine = {
            p["device_uuid"]
            for p in snapshot.get("processes", [])
            if p.get("tenant_id") == tenant_id
        }
        for device in snapshot.get("devices", []):
            if device["uuid"] not in mine or device.get("fragmentation") is None:
                continue
            source = device.get("fragmentation_source") or ""
            rows.append(
                {
                    "node": snapshot.get("node"),
                    "index": device["index"],
                    "name": device["name"],
                    "used_gib": device["mem_used"] / GIB,
                    "total_gib": device["mem_total"] / GIB,
                    "largest_free_gib": (device.get("mem_largest_free") or 0) / GIB,
                    "fragmentation": float(device["fragmentation"]),
                    "source": source,
                    "simulated": bool(snapshot.get("simulated")) or source == "simulated",
                }
            )
    return sorted(rows, key=lambda r: (str(r["node"]), r["index"]))


@require_GET
@tenant_page()
def gpu_memory(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The dashboard's device-memory panel (htmx, every 2 s): fragmentation per GPU."""
    try:
        snapshots = gpu_agent.latest_snapshots()
    except RedisError:
        snapshots = []
    rows = memory_rows(snapshots, tenant.pk)
    return render(request, "serving/gpu/_memory.html", {"rows": rows})


@require_GET
@tenant_page()
def gpu_history(request: HttpRequest, tenant: Tenant) -> JsonResponse:
    """{range, resolution, devices: {uuid: {name, node, simulated, x, gpu_util, mem_util,
    mem_used, mem_total}}, processes: {deployment: {x, used_memory}}}: only devices the
    tenant's replicas used in the range, and only its own processes."""
    name = request.GET.get("range", "1h")
    if name not in HISTORY_RANGES:
        return JsonResponse(
            {"detail": f"range: one of {', '.join(HISTORY_RANGES)}.", "field": "range"}, status=400
        )
    seconds, resolution = HISTORY_RANGES[name]
    since = datetime.fromtimestamp(time.time() - seconds, tz=UTC)
    mine = GpuProcessSample.objects.filter(tenant=tenant, resolution=resolution, at__gte=since)
    uuids = set(mine.values_list("device_uuid", flat=True).distinct())
    devices: dict[str, dict[str, Any]] = {}
    rows = (
        GpuDeviceSample.objects.filter(resolution=resolution, at__gte=since, device_uuid__in=uuids)
        .order_by("at")
        .values_list(
            "device_uuid",
            "name",
            "node",
            "simulated",
            "at",
            "gpu_util",
            "mem_util",
            "mem_used",
            "mem_total",
        )
    )
    for uuid, dev_name, node, simulated, at, util, mem_util, used, total in rows:
        series = devices.setdefault(
            uuid,
            {
                "name": dev_name,
                "node": node,
                "simulated": simulated,
                "x": [],
                "gpu_util": [],
                "mem_util": [],
                "mem_used": [],
                "mem_total": total,
            },
        )
        series["x"].append(at.timestamp())
        series["gpu_util"].append(round(util, 2))
        series["mem_util"].append(round(mem_util, 2))
        series["mem_used"].append(used)
    processes: dict[str, dict[str, list[Any]]] = {}
    for deployment, at, used in mine.order_by("at").values_list(
        "deployment__name", "at", "used_memory"
    ):
        series_p = processes.setdefault(deployment, {"x": [], "used_memory": []})
        if series_p["x"] and series_p["x"][-1] == at.timestamp():
            series_p["used_memory"][-1] += used  # several replicas of one deployment
        else:
            series_p["x"].append(at.timestamp())
            series_p["used_memory"].append(used)
    return JsonResponse(
        {
            "range": name,
            "resolution": int(resolution),
            "from": since.timestamp(),
            "to": time.time(),
            "devices": devices,
            "processes": processes,
        }
    )
