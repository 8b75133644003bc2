"""The request inspector of one deployment: the recent and the slowest requests with their
lifecycle (time validating, routing, executing; status, version and replica that answered,
tokens, prefix-cache hits), searchable by trace id or request id. Reads what the deployment's
router replicas publish under `<prefix>:requests:<app>` (serving.dataplane.lifecycle), merged
over the replicas. Reads only."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from portal.exceptions import NotFoundError, ValidationFailed
from serving.dataplane.lifecycle import (
    EXECUTING,
    MAX_REQUEST_ID,
    PENDING,
    REQUEST_ID,
    ROUTING,
    TRACE_ID,
    VALIDATING,
    requests_key,
)
from serving.deployments.models import Deployment
from serving.deployments.recovery import published_app, redis_client
from tenants.models import Tenant

RECENT_SHOWN = 100
SLOW_SHOWN = 20
STALE_S = 30.0  # a router replica silent this long is gone (its field outlives it in the hash)
PHASES = (VALIDATING, ROUTING, EXECUTING)
QUERY_HELP = (
    f"a trace id (32 hex characters) or a request id (1 to {MAX_REQUEST_ID} visible ASCII "
    "characters, no spaces)"
)


def request_query(value: str) -> tuple[str, str] | None:
    """("trace", id) or ("request", id) for the search box's `q`; None when empty."""
    value = value.strip()
    if not value:
        return None
    if TRACE_ID.match(value.lower()):
        return "trace", value.lower()
    if REQUEST_ID.match(value):
        return "request", value
    raise ValidationFailed(f"q must be {QUERY_HELP}.", field="q")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ms(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and value >= 0 else 0.0


def _row(raw: Mapping[str, Any], router: str) -> dict[str, Any] | None:
    """One published lifecycle as the page shows it; None when it is not one."""
    times = raw.get("times")
    if not isinstance(times, Mapping) or not isinstance(times.get(PENDING), int | float):
        return None
    spent = raw.get("ms") if isinstance(raw.get("ms"), Mapping) else {}
    phases = [{"state": s, "ms": _ms(spent.get(s))} for s in PHASES if s in spent]
    whole = sum(p["ms"] for p in phases)
    for phase in phases:  # the bar's segments, as shares of the time the phases took
        phase["pct"] = round(100 * phase["ms"] / whole, 1) if whole else 0.0
    state = str(raw.get("state") or "")
    done = state in ("completed", "failed")
    return {
        "request_id": str(raw.get("request_id") or "")[:MAX_REQUEST_ID],
        "trace_id": str(raw.get("trace_id") or ""),
        "state": state,
        "done": done,
        "group": raw.get("group"),
        "status": _count(raw.get("status")),
        "code": raw.get("code"),
        "error": raw.get("error"),
        "version": raw.get("version"),
        "replica": raw.get("replica"),
        "pid": _count(raw.get("pid")),
        "router": router,
        "prompt_tokens": _count(raw.get("prompt_tokens")),
        "completion_tokens": _count(raw.get("completion_tokens")),
        "prefix_hit_tokens": _count(raw.get("prefix_hit_tokens")),
        "answered": raw.get("version") is not None,
        "started": float(times[PENDING]),
        "at": datetime.fromtimestamp(float(times[PENDING]), tz=UTC),
        "total_ms": _ms(raw.get("total_ms")) if done else None,
        "phases": phases,
    }


def _routers(app: str) -> list[dict[str, Any]] | None:
    import redis

    try:
        raw = redis_client().hgetall(requests_key(settings.SLI_KEY_PREFIX, app))
    except redis.RedisError:
        return None
    out = []
    for value in raw.values():
        try:
            snapshot = json.loads(value)
        except ValueError:
            continue
        if isinstance(snapshot, dict) and float(snapshot.get("at") or 0) >= time.time() - STALE_S:
            out.append(snapshot)
    return out


def request_list(*, tenant: Tenant, deployment: Deployment, query: str = "") -> dict[str, Any]:
    """{"available", "reporting", "recent" (newest first), "slow" (slowest first), "query",
    "found"} of one of `tenant`'s deployments. The Serve application is the deployment's own,
    never the caller's; a foreign deployment is a 404; a bad `query` names the field `q`."""
    if deployment.tenant_id != tenant.pk:
        raise NotFoundError("No such deployment.")
    wanted = request_query(query)
    published = published_app(deployment)
    routers = _routers(published[1]) if published is not None else []
    view: dict[str, Any] = {
        "available": routers is not None,
        "reporting": len(routers or []),
        "query": wanted,
        "found": None,
    }
    recent: dict[tuple[str, str, float], dict[str, Any]] = {}
    slow: dict[tuple[str, str, float], dict[str, Any]] = {}
    for snapshot in routers or []:
        router = str(snapshot.get("replica") or "")
        for into, name in ((recent, "recent"), (slow, "slow")):
            for raw in snapshot.get(name) or []:
                row = _row(raw, router) if isinstance(raw, Mapping) else None
                if row is not None:
                    into[(router, row["request_id"], row["started"])] = row
    view["recent"] = sorted(recent.values(), key=lambda r: -r["started"])[:RECENT_SHOWN]
    view["slow"] = sorted(slow.values(), key=lambda r: -(r["total_ms"] or 0))[:SLOW_SHOWN]
    if wanted is not None:
        kind, value = wanted
        rows = {**recent, **slow}.values()
        found = [
            r
            for r in rows
            if r["request_id"] == value or (kind == "trace" and r["trace_id"] == value)
        ]
        view["found"] = sorted(found, key=lambda r: -r["started"])
    return view
