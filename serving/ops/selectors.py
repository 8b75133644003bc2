"""Reads of the ops loop for pages, the API and incidents (drills): what the last health tick
found, and the stored SLI rows of a slot."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from serving.ops import health
from serving.ops.models import Resolution, SliSample
from serving.ops.sli_store import as_datetime


def deployment_health(deployment_id: int) -> dict[str, Any]:
    """What the last tick found for one deployment ({} before the first, or without Redis)."""
    return health.deployment_health(deployment_id)


def raw_sli_rows(
    *, deployment_id: int, group: str, since: float, until: float | None = None
) -> QuerySet[SliSample]:
    """The slot's raw (per-tick) SLI rows ending after `since` (and starting before `until`)."""
    rows = SliSample.objects.filter(
        deployment_id=deployment_id,
        group=group,
        resolution=Resolution.RAW,
        end__gt=as_datetime(since),
    )
    return rows if until is None else rows.filter(start__lt=as_datetime(until))
