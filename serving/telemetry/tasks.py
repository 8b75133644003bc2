"""Celery tasks of GPU telemetry: pruning stored samples."""

from __future__ import annotations

import time

from portal.celery import task
from serving.telemetry.services import prune_samples


@task(name="serving.prune_gpu_samples", queue="health", time_limit=120)
def prune_gpu_samples() -> dict[str, int]:
    """1 s GPU rows live an hour, minute rows 30 days."""
    return prune_samples(now=time.time())
