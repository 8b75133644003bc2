"""Reads what a deployment's replicas publish about degraded modes and fast recovery: the tier
in force and the time spent degraded in the compensation window (the router's state,
serving.dataplane.tiers), and each version replica's standby copy, disk loads and last failed
hot reload (serving.dataplane.standby). Reads only; None where Redis does not answer."""

from __future__ import annotations

import functools
import json
import time
from typing import Any

from django.conf import settings

from serving.control.names import BadName
from serving.deployments.models import Deployment, DeploymentRevision

SLOTS = ("stable", "canary", "distilled", "proxy")


def hash_values(client: Any, key: str) -> list[dict[str, Any]]:
    out = []
    for raw in client.hgetall(key).values():
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _tier(routers: list[dict[str, Any]], declared: dict[str, Any]) -> dict[str, Any] | None:
    if not declared.get("levels"):
        return None
    states = [r["tier"] for r in routers if isinstance(r.get("tier"), dict)]
    if not states:
        return {"declared": declared, "reporting": 0}
    latest = max(states, key=lambda s: float(s.get("since") or 0))
    return {
        "declared": declared,
        "reporting": len(states),
        "tier": latest.get("tier"),
        "reason": latest.get("reason"),
        "since_s": round(max(0.0, time.time() - float(latest.get("since") or 0)), 1),
        "sigma": (latest.get("drift") or {}).get("sigma"),
        "pinned": latest.get("pinned"),
        # The compensation SLA: the most any router replica spent degraded in the window.
        "degraded_min": round(max(float(s.get("degraded_s") or 0) for s in states) / 60, 2),
        "window_min": round(float(latest.get("window_s") or 0) / 60, 1),
        "transitions": list(latest.get("transitions") or [])[-5:],
    }


def _standby(windows: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for group, window in windows:
        standby = (window.get("kv") or {}).get("standby")
        if isinstance(standby, dict):
            rows.append({"group": group, "replica": window.get("replica"), **standby})
    return sorted(rows, key=lambda r: (r["group"], str(r["replica"])))


def published_app(deployment: Deployment) -> tuple[DeploymentRevision, str] | None:
    """(current revision, Serve application) of a deployment whose replicas may publish: not
    deleted, with a revision and an application name; None otherwise."""
    revision = deployment.current_revision
    if revision is None or deployment.deleted_at is not None:
        return None
    try:
        return revision, deployment.serve_app
    except BadName:
        return None


def redis_client() -> Any:
    """A client of the portal's Redis that gives up after half a second (pages stay up); one
    per process and URL, so a panel polled every 5 s reuses its pool's connections."""
    return _client(settings.REDIS_URL)


@functools.lru_cache(maxsize=4)
def _client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


def deployment_recovery(*, deployment: Deployment) -> dict[str, Any] | None:
    """{"tier": ... or None, "standby": [per version replica]}; None when Redis is down."""
    import redis

    published = published_app(deployment)
    if published is None:
        return None
    revision, app = published
    prefix = settings.SLI_KEY_PREFIX
    try:
        client = redis_client()
        routers = hash_values(client, f"{prefix}:router:{app}")
        # Every slot's replicas publish under the router's application (serving.control).
        windows = [
            (slot, w) for slot in SLOTS for w in hash_values(client, f"{prefix}:sli:{app}:{slot}")
        ]
    except redis.RedisError:
        return None
    return {"tier": _tier(routers, revision.tiers or {}), "standby": _standby(windows)}
