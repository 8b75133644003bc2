"""The Serve API guard's state (serving.control.breaker), Django side: every process that calls
Serve publishes its guard's snapshot to Redis (at each state change, and at most once a second
otherwise), so the web processes show one platform-wide state: /metrics, the status badge on
every page, and the alert when a breaker opens (a `portal.state` line on the operator's console
and an entry in the platform's control-plane event list).

Redis layout (one module per contract):
  <prefix>:control:serve_api          hash  "<host>:<pid> <dashboard>" -> snapshot JSON (TTL)
  <prefix>:control:serve_api:events   list  newest first, the last EVENTS_KEPT state changes
"""

from __future__ import annotations

import json
import logging
import time
from functools import lru_cache
from typing import Any

from django.conf import settings

from portal import statelog
from serving.control import breaker

logger = logging.getLogger(__name__)

GUARDS_KEY = "{prefix}:control:serve_api"
EVENTS_KEY = "{prefix}:control:serve_api:events"
EVENTS_KEPT = 50
# A process that stopped calling Serve (or died) leaves its last snapshot this long at most.
STALE_AFTER_S = 300.0
_RANK = {"closed": 0, "half_open": 1, "open": 2}
PRUNE_EVERY_S = 30.0  # a publishing process drops dead processes' snapshots this often
_pruned_at = 0.0


@lru_cache(maxsize=4)
def _client(url: str) -> Any:
    import redis

    # Short timeouts: publishing rides on Serve API calls and must never hold them up.
    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


def redis_client(url: str) -> Any:
    return _client(url)


def _key(template: str) -> str:
    return template.format(prefix=settings.SLI_KEY_PREFIX)


def publish(snapshot: dict[str, Any], changed: bool) -> None:
    """breaker.observe callback: store this process's snapshot; a state change is an alert."""
    client = redis_client(settings.REDIS_URL)
    field = f"{breaker.process_label()} {snapshot['endpoint']}"
    pipe = client.pipeline()
    pipe.hset(_key(GUARDS_KEY), field, json.dumps(snapshot))
    pipe.expire(_key(GUARDS_KEY), int(STALE_AFTER_S))
    if changed:
        event = {
            "at": snapshot["at"],
            "state": snapshot["state"],
            "endpoint": snapshot["endpoint"],
            "process": breaker.process_label(),
            "consecutive_failures": snapshot["consecutive_failures"],
            "latency_last_s": snapshot["latency_last_s"],
        }
        pipe.lpush(_key(EVENTS_KEY), json.dumps(event))
        pipe.ltrim(_key(EVENTS_KEY), 0, EVENTS_KEPT - 1)
    pipe.execute()
    _prune(client, float(snapshot.get("at") or time.time()))
    if changed:
        # Not state_changed(): this runs on whatever thread made the Serve call, inside no
        # transaction of its own, and must not open a database connection there.
        statelog.logger.info(
            "Serve API circuit breaker %s for %s (%s consecutive failed or slow calls, last "
            "%.2f s)",
            snapshot["state"],
            snapshot["endpoint"],
            snapshot["consecutive_failures"],
            snapshot["latency_last_s"] or 0.0,
        )


def _prune(client: Any, now: float) -> None:
    """Drop the snapshots of processes that stopped publishing (dead ones too): older than the
    readers' cutoff. Every publish refreshes the key's TTL, so without this they would stay."""
    global _pruned_at
    if now - _pruned_at < PRUNE_EVERY_S:
        return
    _pruned_at = now
    stale = []
    for name, value in client.hgetall(_key(GUARDS_KEY)).items():
        try:
            at = float(json.loads(value).get("at", 0))
        except (ValueError, TypeError, AttributeError):
            at = 0.0
        if now - at > STALE_AFTER_S:
            stale.append(name)
    if stale:
        client.hdel(_key(GUARDS_KEY), *stale)


def install() -> None:
    """Publish this process's guards (ServingConfig.ready)."""
    breaker.observe(publish)


def guard_snapshots() -> list[dict[str, Any]]:
    """Every process's fresh snapshot (stale ones are left out)."""
    try:
        raw = redis_client(settings.REDIS_URL).hgetall(_key(GUARDS_KEY))
    except Exception as exc:  # a page must render without Redis
        logger.warning("control-plane state unreadable: %s", exc)
        return []
    now = time.time()
    out = []
    for field, value in raw.items():
        try:
            snap = json.loads(value)
        except ValueError:
            continue
        if now - float(snap.get("at", 0)) <= STALE_AFTER_S:
            snap["process"] = (field.decode() if isinstance(field, bytes) else field).split()[0]
            out.append(snap)
    return sorted(out, key=lambda s: (s["process"], s["endpoint"]))


def control_plane_status() -> dict[str, Any]:
    """The platform's view: the worst state of any process's breaker, the totals, the
    slowest recent latency and the recent state changes."""
    snaps = guard_snapshots()
    state = max((s["state"] for s in snaps), key=lambda s: _RANK.get(s, 0), default="closed")
    totals = {
        name: sum(int(s.get(name, 0)) for s in snaps)
        for name in ("requests", "http_calls", "retries", "retries_denied", "rejected", "opened")
    }
    latencies = [s["latency_p50_s"] for s in snaps if s.get("latency_p50_s") is not None]
    try:
        events = [
            json.loads(e) for e in redis_client(settings.REDIS_URL).lrange(_key(EVENTS_KEY), 0, 9)
        ]
    except Exception:
        events = []
    return {
        "state": state,
        "degraded": state != "closed",
        "processes": snaps,
        "latency_p50_s": max(latencies) if latencies else None,
        "events": events,
        **totals,
    }
