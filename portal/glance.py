"""The tenant's home page: every deployment at a glance (issue 19, item 1).

Composition (the top of the portal app): it reads serving and incidents through their
public selectors. A row per deployment: its state, its SLO (the least error budget left over
its objectives, the hottest burn rate, what is firing), its traffic over the last five minutes
(requests/s, error ratio, p95 latency and time to first token), its canary and rollout, its KV
use, open incidents and rollbacks of the last day; tiles above sum the tenant up against its
quota. A fixed number of queries and one Redis read, whatever the number of deployments (a
test holds it). The page polls its live part every few seconds and re-fetches it at once when
the tenant's incident stream says an incident changed (static/js/incidents-live.js).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET
from redis.exceptions import RedisError

from incidents import selectors as incident_selectors
from serving.dataplane.sli import quantile
from serving.deployments import selectors as deployment_selectors
from serving.ops import selectors as ops_selectors
from serving.ops.models import RolloutStatus
from serving.slo.counts import Counts
from tenants import selectors as tenant_selectors
from tenants import usage
from tenants.models import Tenant
from tenants.pages import tenant_page

WINDOW_S = 300  # the traffic columns: the last five minutes
ROLLBACKS_S = 24 * 3600  # the rollbacks column: the last day
LIVE_ROLLOUTS = (RolloutStatus.PROGRESSING, RolloutStatus.PAUSED, RolloutStatus.NEEDS_REVIEW)
LISTED = 5  # open incidents and recent rollbacks listed under the table


def _slo(found: dict[str, Any]) -> dict[str, Any]:
    """The deployment's SLO in one cell: over both slots' objectives, the least error budget
    left, the hottest burn rate, what fires, and the state (breach wins over ok)."""
    budgets: list[float] = []
    burns: list[float] = []
    firing: list[dict[str, Any]] = []
    states: set[str] = set()
    for evaluation in (found.get("slots") or {}).values():
        firing += evaluation.get("firing") or []
        for objective in evaluation.get("objectives") or []:
            ok = objective.get("ok")
            states.add("nodata" if ok is None else ("ok" if ok else "breach"))
            budget = objective.get("budget") or {}
            if objective.get("kind") == "ratio" and budget.get("total"):
                budgets.append(float(budget["remaining"]))
            burns += [float(b) for b in (objective.get("burn_rates") or {}).values() if b]
    left = min(budgets) if budgets else None
    burn = max(burns) if burns else None
    state = next((s for s in ("breach", "ok", "nodata") if s in states), "none")
    return {
        "state": state,
        "budget_left": left,
        "bar_width": None if left is None else round(min(1.0, max(0.0, left)) * 100, 1),
        "burn": burn,
        "hot": burn is not None and burn >= 1,
        "firing": len(firing),
        "firing_names": ", ".join(sorted({str(f.get("name")) for f in firing}))[:200],
    }


def _traffic(counts: list[Counts]) -> dict[str, Any]:
    """Requests/s, error ratio and p95 latency / TTFT (ms, a bucket's upper bound) of the
    deployment's slots over the window; None where nothing was served."""
    total = sum(counts, Counts())
    seconds = max((c.seconds for c in counts), default=0.0)
    served = total.requests
    return {
        "rps": served / seconds if seconds > 0 else None,
        "error_ratio": total.errors / served if served else None,
        "p95_ms": quantile(total.latency, 0.95) if served else None,
        "ttft_p95_ms": quantile(total.ttft, 0.95) if served else None,
        "requests": served,
    }


def _kv(found: dict[str, Any]) -> dict[str, Any] | None:
    kv = (found.get("kv") or {}).get("stable") or {}
    total = int(kv.get("blocks_total") or 0)
    if not total:
        return None
    used = int(kv.get("blocks_used") or 0)
    return {"used": used, "total": total, "width": round(min(1.0, used / total) * 100, 1)}


def glance(*, tenant: Tenant) -> dict[str, Any]:
    """The home page's rows and tiles for `tenant`."""
    deployments = list(deployment_selectors.deployment_list(tenant=tenant))
    try:
        health = ops_selectors.deployments_health([d.pk for d in deployments])
        health_ok = True
    except RedisError:
        health, health_ok = {}, False
    counts = ops_selectors.recent_counts(tenant=tenant, seconds=WINDOW_S)
    rollouts = {
        r.deployment_id: r
        for r in ops_selectors.rollout_list(tenant=tenant).filter(status__in=LIVE_ROLLOUTS)
    }
    day_ago = timezone.now() - timedelta(seconds=ROLLBACKS_S)
    rollbacks = list(
        ops_selectors.rollback_list(tenant=tenant)
        .filter(created_at__gte=day_ago)
        .select_related("deployment")  # the list under the table names it
    )
    rolled_back = Counter(r.deployment_id for r in rollbacks)
    slots_of: dict[int, list[Counts]] = {}
    for (deployment_id, _), slot_counts in counts.items():
        slots_of.setdefault(deployment_id, []).append(slot_counts)
    open_by_deployment = incident_selectors.open_counts_by_deployment(tenant)
    now = time.time()
    rows = []
    for d in deployments:
        found = health.get(d.pk) or {}
        checked = found.get("checked_at")
        slots = slots_of.get(d.pk, [])
        canary = counts.get((d.pk, "canary"))
        rollout = rollouts.get(d.pk)
        rows.append(
            {
                "d": d,
                "rev": d.current_revision,
                "slo": _slo(found),
                "traffic": _traffic(slots),
                "canary_errors": (canary.errors / canary.requests)
                if canary is not None and canary.requests
                else None,
                "rollout": rollout,
                "rollout_step": None
                if rollout is None
                else {"index": rollout.step_index + 1, "of": len(rollout.steps or [])},
                "kv": _kv(found),
                "incidents": open_by_deployment.get(d.pk, 0),
                "rollbacks": rolled_back[d.pk],
                "checked_age_s": None if not checked else max(0.0, now - float(checked)),
                "probe": found.get("probe") or {},
            }
        )
    quota = tenant_selectors.quota_get(tenant=tenant)
    use = deployment_selectors.quota_use(deployments=deployments)
    all_traffic = _traffic(list(counts.values()))
    return {
        "rows": rows,
        "health_ok": health_ok,
        "window_min": WINDOW_S // 60,
        "tiles": {
            "running": sum(1 for d in deployments if d.status == "running"),
            "deployments": len(deployments),
            "open_incidents": sum(open_by_deployment.values()),
            "firing": sum(r["slo"]["firing"] for r in rows),
            "breaching": sum(1 for r in rows if r["slo"]["state"] == "breach"),
            "rollbacks": len(rollbacks),
            "rps": all_traffic["rps"],
            "error_ratio": all_traffic["error_ratio"],
        },
        "quota": quota,
        "use": [
            _use("GPUs", use["gpus"], quota.max_gpus),
            _use("Replicas", use["replicas"], quota.max_replicas),
            _use("KV-cache blocks", use["kv_blocks"], quota.max_kv_blocks),
            _use("Deployments", len(deployments), quota.max_deployments),
        ],
        "recent_rollbacks": rollbacks[:LISTED],
        "open_incidents": list(incident_selectors.open_incidents(tenant=tenant)[:LISTED]),
    }


def _use(label: str, used: float, limit: int) -> dict[str, Any]:
    share = used / limit if limit else 1.0
    return {
        "label": label,
        "used": used,
        "limit": limit,
        "width": round(min(1.0, share) * 100, 1),
        "tone": "out" if share > 0.9 else ("low" if share > 0.7 else ""),
    }


@require_GET
@tenant_page()
def tenant_overview(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    context = {
        **glance(tenant=tenant),
        "storage_used_bytes": usage.storage_used_bytes(tenant),
        "member_count": tenant_selectors.membership_list(tenant=tenant).count(),
    }
    return render(request, "tenants/overview.html", context)


@require_GET
@tenant_page()
def tenant_overview_live(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The live part of the home page (tiles, the deployments table, incidents, rollbacks):
    polled every few seconds, re-fetched at once on an incident event."""
    return render(request, "tenants/_glance.html", glance(tenant=tenant))
