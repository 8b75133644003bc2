"""Health checks: one tick (Celery beat, queue `health`, every 2 s by default) for every live
deployment: a synthetic probe through the Serve proxy with the deployment's probe key, the
SLI counters its replicas published, both stored as SLI windows and evaluated against the
deployment's contract; breaches open incidents and trigger the contract's actions.

A tick costs a fixed number of round trips, whatever the number of deployments: two queries
for the targets and their contracts, one pipelined Redis read, one query for the window
boundaries, one insert batch, one pipelined Redis write. Only breaches and rollout steps
(rare) write more.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from serving.ops.health.kv_integrity import alert_kv_integrity
from serving.ops.health.probe import PROBE_BODY, probe, probe_streaks
from serving.ops.health.slots import tick_slots
from serving.ops.health.state import (
    TICK_BUCKETS_S,
    deployment_health,
    health_keys,
    health_redis,
    loads,
    tick_finish,
    tick_skipped,
    tick_stats,
)
from serving.ops.health.targets import (
    LIVE_STATUSES,
    PROBE_STATUSES,
    STALE_S,
    SlotResult,
    Target,
    clear_caches,
    health_targets,
)

__all__ = [
    "LIVE_STATUSES",
    "PROBE_BODY",
    "PROBE_STATUSES",
    "STALE_S",
    "SlotResult",
    "TICK_BUCKETS_S",
    "Target",
    "clear_caches",
    "deployment_health",
    "health_keys",
    "health_redis",
    "health_targets",
    "loads",
    "probe",
    "probe_streaks",
    "tick",
    "tick_stats",
]


def tick(
    *,
    now: float | None = None,
    redis_client: Any = None,
    serve_url: str | None = None,
    act: bool = True,
    deployment_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One health tick over every live deployment that is due (its `health_interval_s`)."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    r = redis_client or health_redis()
    keys = health_keys()
    token = secrets.token_hex(8)
    if not r.set(keys["lock"], token, nx=True, px=30_000):
        tick_skipped(r, keys)
        return {"skipped": "another tick is running"}
    try:
        report = tick_slots(now, r, keys, serve_url, act, deployment_ids)
        if act:  # a replica's broken KV pool: an incident, once (serving.ops.health.kv_integrity)
            report["actions"] += alert_kv_integrity(r, keys, time.time(), deployment_ids)
    finally:
        seconds = time.perf_counter() - started
        if tick_finish(r, keys, token, seconds=seconds, at=time.time()):
            r.delete(keys["lock"])
    report["duration_ms"] = round(seconds * 1000, 2)
    return report
