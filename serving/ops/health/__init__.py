"""Health checks: one tick (Celery beat, queue `health`, every 1 s by default) for every due
deployment: a synthetic probe through the Serve proxy with the deployment's probe key, the
SLI counters its replicas published, both stored as SLI windows and evaluated against the
deployment's contract; breaches open incidents and trigger the contract's actions.

A tick costs a fixed number of round trips, whatever the number of deployments: two queries
for the targets and their contracts, one pipelined Redis read, one query for the window
boundaries, one insert batch, one pipelined Redis write. Only breaches and rollout steps
(rare) write more.

With HEALTH_SHARDS > 1 the beat's tick is split: shard k of n ticks the deployments with
`pk % n == k`, under its own lease (serving.ops.health.lease), so workers tick shards side by
side and a dead worker's shard goes to the next worker that picks up its tick.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from serving.ops.health.lease import Lease, shard_label, shard_lock_key
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
    shard: int = 0,
    shards: int = 1,
) -> dict[str, Any]:
    """One health tick over every live deployment that is due (its `health_interval_s`), or
    over one shard of them (`pk % shards == shard`) under that shard's lease."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    r = redis_client or health_redis()
    keys = health_keys()
    label, lock = shard_label(shard, shards), shard_lock_key(keys["lock"], shard, shards)
    lease = Lease.acquire(r, lock, secrets.token_hex(8))
    if lease is None:
        tick_skipped(r, keys, label)
        return {"skipped": "another tick is running", "shard": label}
    report: dict[str, Any] = {"deployments": 0}
    lease.keep()
    try:
        report = tick_slots(
            now, r, keys, serve_url, act, deployment_ids, (shard, shards), held=lease.held
        )
    finally:
        lease.stop()
        seconds = time.perf_counter() - started
        tick_finish(  # and releases the lease, if this tick still holds it
            r,
            keys,
            lease.token,
            seconds=seconds,
            at=time.time(),
            lock_key=lock,
            shard=label,
            deployments=int(report["deployments"]),
        )
    report["duration_ms"] = round(seconds * 1000, 2)
    report["shard"] = label
    return report
