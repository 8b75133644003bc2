"""Reads of the ops loop for pages, the API and incidents (drills): what the last health tick
found, and the stored SLI rows of a slot."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet
from django.utils import timezone

from serving.ops import health
from serving.ops.health.state import health_keys, health_redis, loads
from serving.ops.models import Resolution, Rollback, Rollout, RolloutPolicy, SliSample
from serving.ops.sli_store import as_datetime
from serving.slo.counts import Counts

# A row's own counts (serving.slo.Counts' names), beside its cumulative totals.
_DELTAS = ("requests", "errors", "rejected", "tokens_in", "tokens_out", "latency", "ttft", "itl")

if TYPE_CHECKING:
    from serving.deployments.models import Deployment
    from tenants.models import Tenant


def deployment_health(deployment_id: int) -> dict[str, Any]:
    """What the last tick found for one deployment ({} before the first)."""
    return health.deployment_health(deployment_id)


def deployments_health(deployment_ids: list[int]) -> dict[int, dict[str, Any]]:
    """What the last tick found for each of `deployment_ids`, in one Redis read (the home
    page's rows); a deployment not checked yet is missing."""
    if not deployment_ids:
        return {}
    raw = health_redis().hmget(health_keys()["deployments"], [str(i) for i in deployment_ids])
    found = {i: loads(value) for i, value in zip(deployment_ids, raw, strict=True)}
    return {i: value for i, value in found.items() if value}


def recent_counts(*, tenant: Tenant, seconds: float) -> dict[tuple[int, str], Counts]:
    """Each slot's counts over about the last `seconds`, from two indexed queries whatever the
    number of rows: the newest raw row's cumulative totals minus those of the oldest row in the
    window, plus that oldest row's own deltas; `seconds` spans the oldest row's start to the
    newest one's end (one row: its own deltas)."""
    since = timezone.now() - timedelta(seconds=seconds)
    rows = SliSample.objects.filter(tenant=tenant, resolution=Resolution.RAW, end__gte=since)
    fields = ("deployment_id", "group", "start", "end", "cumulative", *_DELTAS)

    def ends(order: str) -> dict[tuple[int, str], dict[str, Any]]:
        found = rows.order_by("deployment_id", "group", order).distinct("deployment_id", "group")
        return {(r["deployment_id"], r["group"]): r for r in found.values(*fields)}

    newest, oldest = ends("-end"), ends("end")
    counts: dict[tuple[int, str], Counts] = {}
    for slot, last in newest.items():
        first = oldest.get(slot, last)
        window = Counts.from_dict(last["cumulative"] or {}) - Counts.from_dict(
            first["cumulative"] or {}
        )
        # A row stored without a histogram (an empty list) counts as zeros.
        own = {name: first[name] for name in _DELTAS if first[name] not in (None, [])}
        window = window + Counts.from_dict(own)
        window.seconds = max(0.0, (last["end"] - first["start"]).total_seconds())
        counts[slot] = window
    return counts


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


def sli_window(
    *, tenant: Tenant, deployment: Deployment, resolution: str, seconds: float
) -> QuerySet[SliSample]:
    """The tenant's stored SLI rows of one deployment at `resolution` that ended in the last
    `seconds`, oldest first: what the health charts and the API's SLI route read."""
    return SliSample.objects.filter(
        tenant=tenant,
        deployment=deployment,
        resolution=resolution,
        end__gte=timezone.now() - timedelta(seconds=seconds),
    ).order_by("end")


def sli_samples_between(
    *, tenant: Tenant, deployment_id: int, start: datetime, end: datetime
) -> list[SliSample]:
    """The tenant's SLI rows of a deployment overlapping [start, end], one resolution only (raw
    ticks where there are any, else minutes), so nothing is counted twice: what an incident's
    evidence and its postmortem read."""
    rows = list(
        SliSample.objects.filter(
            tenant=tenant, deployment_id=deployment_id, end__gt=start, start__lt=end
        ).order_by("end", "id")
    )
    raw = [r for r in rows if r.resolution == Resolution.RAW]
    return raw or [r for r in rows if r.resolution == Resolution.MINUTE]


def rollout_list(*, tenant: Tenant, deployment: Deployment | None = None) -> QuerySet[Rollout]:
    """The tenant's rollouts (of one deployment), newest first, with what every list shows."""
    rows = Rollout.objects.filter(tenant=tenant)
    if deployment is not None:
        rows = rows.filter(deployment=deployment)
    return (
        rows.select_related("canary_version__model", "base_revision", "deployment", "created_by")
        .prefetch_related("analyses")
        .order_by("-started_at")
    )


def rollback_list(*, tenant: Tenant, deployment: Deployment | None = None) -> QuerySet[Rollback]:
    """The tenant's rollbacks (of one deployment), newest first, with their revisions."""
    rows = Rollback.objects.filter(tenant=tenant)
    if deployment is not None:
        rows = rows.filter(deployment=deployment)
    return rows.select_related(
        "from_revision__stable_version__model",
        "to_revision__stable_version__model",
        "new_revision",
        "created_by",
    ).order_by("-created_at")


def policy_get(*, tenant: Tenant, deployment: Deployment) -> RolloutPolicy | None:
    """The deployment's rollout policy (None: the defaults apply)."""
    return RolloutPolicy.objects.filter(tenant=tenant, deployment=deployment).first()
