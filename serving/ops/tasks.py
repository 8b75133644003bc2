"""Celery tasks of the ops loop: the health tick, rollbacks, SLI pruning."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from portal.celery import task
from serving.control.serve_api import ServeApiError


@task(name="serving.health_tick", queue="health", time_limit=30)
def health_tick() -> dict[str, object]:
    """Probe, read the replicas' SLI counters, store and evaluate them against the contracts,
    act on breaches, advance rollouts (beat, every HEALTH_TICK_S). With HEALTH_SHARDS > 1,
    one `health_tick_shard` task per shard instead, all at this tick's time, for whichever
    health workers are free (a message left in a backlog expires after five ticks, and one
    run over a tick late ticks at the latest beat time since, not its own)."""
    import time

    shards = max(1, int(settings.HEALTH_SHARDS))
    if shards == 1:
        report: dict[str, object] = health_tick_shard(0, 1)
        return report
    now = time.time()
    beat: dict[str, Any] = settings.CELERY_BEAT_SCHEDULE["health-tick"]
    expires = 5 * float(beat["schedule"])
    for shard in range(shards):
        health_tick_shard.apply_async((shard, shards, now), expires=expires)
    return {"shards": shards, "at": now}


@task(name="serving.health_tick_shard", queue="health", time_limit=30)
def health_tick_shard(shard: int, shards: int, now: float | None = None) -> dict[str, object]:
    """One shard's health tick (deployments `pk % shards == shard`) under its lease: skipped
    while another worker ticks that shard; a dead worker's shard is free LEASE_S later.
    `now` is the beat's time, shared by the shards of one tick; a message that waited over
    a tick in the queue ticks at the latest beat time since (its rows would be stamped
    seconds late)."""
    import time

    from serving.control.cluster import ray_target_from_env
    from serving.ops import health

    beat: dict[str, Any] = settings.CELERY_BEAT_SCHEDULE["health-tick"]
    period = float(beat["schedule"])
    if now is not None and time.time() - now > period:
        # The latest beat time passed since: the tick stays on the beat's grid (the next
        # on-time message finds its deployments due as planned).
        now += ((time.time() - now) // period) * period

    try:
        serve_url: str | None = ray_target_from_env().serve_url
    except Exception:  # no cluster configured: SLIs and contracts still evaluate
        serve_url = None
    return health.tick(
        now=now,
        serve_url=serve_url if settings.HEALTH_PROBES else None,
        shard=shard,
        shards=shards,
    )


@task(
    name="serving.execute_rollback",
    queue="health",
    time_limit=60,
    idempotent=True,
    autoretry_for=(ServeApiError,),
    retry_backoff=1,
    retry_backoff_max=10,
    max_retries=10,
)
def execute_rollback(rollback_id: int) -> str | None:
    """Run or resume one rollback (idempotent: a re-delivered or re-enqueued task finds the
    revision already written and only finishes what is left)."""
    from serving.ops.rollbacks import rollback_execute

    rollback = rollback_execute(rollback_id=rollback_id)
    return None if rollback is None else rollback.status


@task(name="serving.prune_sli_samples", queue="health", time_limit=120)
def prune_sli_samples() -> dict[str, int]:
    """Raw SLI rows live an hour, minute rows 30 days."""
    import time

    from serving.ops.sli_store import prune

    return prune(now=time.time())
