"""The portal's own tasks: the heartbeat each queue's workers run (portal.heartbeats)."""

from __future__ import annotations

from typing import Any

from portal import heartbeats
from portal.celery import task


@task(name="portal.heartbeat", queue="default", time_limit=10)
def heartbeat(queue: str) -> None:
    """Run on `queue` (beat routes one per queue): stamp this worker's heartbeat there."""
    request: Any = heartbeat.request
    heartbeats.record_worker(queue, str(request.hostname or "eager"))
