"""Incident analytics of one tenant: incidents per week by severity, time to detect and to
restore (p50 / p95, real incidents and drills apart), and availability per deployment.

Definitions:
- MTTD, time to detect: from the fault's onset to the incident opening. A drill's onset is
  its run's `injected_at`; a real incident's is the start of the first SLI row (the stored
  minute or raw windows of its deployment) in the 15 minutes before it opened that counted
  errors or a failed probe; an incident with no such row has no measured onset and is left out
  (the `n` of each figure says how many were measured).
- MTTR, time to restore: from opening to mitigated (or resolved when it skipped mitigated).
- Percentiles interpolate linearly between the closest ranks (numpy's default).
- Availability of a deployment over the window, two figures: requests (1 - errors / requests
  of its stored minute SLI rows; none without traffic) and incident-free time (1 - the time
  covered by its real incidents, open to restored, overlaps merged, / the window).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import (
    Count,
    DateTimeField,
    ExpressionWrapper,
    OuterRef,
    Q,
    Subquery,
)
from django.db.models.functions import TruncWeek
from django.utils import timezone

from incidents.drills.models import DrillRun
from incidents.models import Incident, Severity
from serving.deployments.models import Deployment
from serving.ops import selectors as ops_selectors
from serving.ops.models import SliSample
from tenants.models import Tenant

ONSET_LOOKBACK = timedelta(minutes=15)
MAX_WEEKS = 52
MAX_WINDOW_DAYS = 30  # minute SLI rows are kept 30 days
MAX_INCIDENTS = 5000  # the newest incidents of the window that the figures read


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) of `values`, linear between closest ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Durations:
    n: int
    p50_s: float | None
    p95_s: float | None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Durations:
        return cls(len(seconds), percentile(seconds, 0.5), percentile(seconds, 0.95))


def weekly_counts(*, tenant: Tenant, since: datetime, now: datetime) -> list[dict[str, Any]]:
    """Per ISO week (Monday 00:00 UTC) from the one holding `since`: real incidents by
    severity, and drills (each listed week counted whole, its first one too)."""
    since = since.astimezone(UTC)
    start = since - timedelta(days=since.weekday())
    start = start.replace(hour=0, minute=0, second=0, microsecond=0)
    rows = (
        Incident.objects.filter(tenant=tenant, triggered_at__gte=start)
        .annotate(week=TruncWeek("triggered_at", tzinfo=UTC))
        .values("week", "severity", "is_drill")
        .annotate(n=Count("id"))
    )
    weeks: dict[datetime, dict[str, Any]] = {}
    for row in rows:
        week = weeks.setdefault(
            row["week"], {"week": row["week"], **{s: 0 for s in Severity.values}, "drill": 0}
        )
        week["drill" if row["is_drill"] else row["severity"]] += row["n"]
    out, week_start = [], start
    while week_start <= now:
        out.append(
            weeks.get(week_start)
            or {"week": week_start, **{s: 0 for s in Severity.values}, "drill": 0}
        )
        week_start += timedelta(days=7)
    return out


def _timings(tenant: Tenant, since: datetime) -> list[dict[str, Any]]:
    """The window's incidents with their onset (see the module's docstring), one query."""
    lookback = ExpressionWrapper(
        OuterRef("triggered_at") - ONSET_LOOKBACK, output_field=DateTimeField()
    )
    bad = SliSample.objects.filter(
        tenant=OuterRef("tenant"),
        deployment_id=OuterRef("deployment_id"),
        end__gt=lookback,
        start__lte=OuterRef("triggered_at"),
    ).filter(Q(errors__gt=0) | Q(probe_ok=False))
    injected = DrillRun.objects.filter(tenant=OuterRef("tenant"), pk=OuterRef("drill_run_id"))
    return list(
        Incident.objects.filter(tenant=tenant, triggered_at__gte=since)
        .annotate(
            sli_onset=Subquery(bad.order_by("start").values("start")[:1]),
            injected_at=Subquery(injected.values("injected_at")[:1]),
        )
        .order_by("-triggered_at")
        .values(
            "id",
            "is_drill",
            "triggered_at",
            "mitigated_at",
            "resolved_at",
            "deployment_id",
            "sli_onset",
            "injected_at",
        )[:MAX_INCIDENTS]
    )


def detect_seconds(row: dict[str, Any]) -> float | None:
    onset = row["injected_at"] if row["is_drill"] else row["sli_onset"]
    if onset is None:
        return None
    return max(0.0, (row["triggered_at"] - onset).total_seconds())


def restore_seconds(row: dict[str, Any]) -> float | None:
    end = row["mitigated_at"] or row["resolved_at"]
    return None if end is None else max(0.0, (end - row["triggered_at"]).total_seconds())


def merged_seconds(spans: list[tuple[datetime, datetime]]) -> float:
    """Seconds covered by the spans, overlaps counted once."""
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is not None:
            start = max(start, reach)
        if end > start:
            total += (end - start).total_seconds()
        reach = end if reach is None else max(reach, end)
    return total


def availability(
    *, tenant: Tenant, rows: list[dict[str, Any]], since: datetime, now: datetime
) -> list[dict[str, Any]]:
    """Per live deployment of the tenant: request availability and incident-free time."""
    deployments = Deployment.objects.filter(tenant=tenant, deleted_at__isnull=True).order_by("name")
    # The SUM of every minute row's counts, taken from cumulative totals where it is exact.
    sums = ops_selectors.window_request_totals(tenant=tenant, since=since, now=now)
    spans: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for row in rows:
        if row["is_drill"] or row["deployment_id"] is None:
            continue
        end = row["mitigated_at"] or row["resolved_at"] or now
        spans[row["deployment_id"]].append((max(row["triggered_at"], since), min(end, now)))
    window = (now - since).total_seconds()
    out = []
    for deployment in deployments.values("id", "name"):
        requests, errors = sums.get(deployment["id"], (0, 0))
        down = merged_seconds(spans.get(deployment["id"], []))
        out.append(
            {
                "deployment": deployment["id"],
                "name": deployment["name"],
                "requests": requests,
                "errors": errors,
                "request_availability": 1 - errors / requests if requests else None,
                "incident_free": max(0.0, 1 - down / window) if window > 0 else None,
                "incidents": len(spans.get(deployment["id"], [])),
            }
        )
    return out


def incident_analytics(
    *, tenant: Tenant, weeks: int = 12, window_days: int = 7, now: datetime | None = None
) -> dict[str, Any]:
    """Everything the analytics page and API show, for the last `weeks` and `window_days`."""
    now = now or timezone.now()
    weeks = max(1, min(int(weeks), MAX_WEEKS))
    window_days = max(1, min(int(window_days), MAX_WINDOW_DAYS))
    since = now - timedelta(weeks=weeks)
    rows = _timings(tenant, min(since, now - timedelta(days=window_days)))
    in_weeks = [r for r in rows if r["triggered_at"] >= since]
    figures: dict[str, Any] = {}
    for label, drill in (("real", False), ("drill", True)):
        chosen = [r for r in in_weeks if r["is_drill"] is drill]
        detect = [s for r in chosen if (s := detect_seconds(r)) is not None]
        restore = [s for r in chosen if (s := restore_seconds(r)) is not None]
        figures[label] = {
            "incidents": len(chosen),
            "mttd": Durations.of(detect).__dict__,
            "mttr": Durations.of(restore).__dict__,
        }
    window_start = now - timedelta(days=window_days)
    in_window = [r for r in rows if (r["mitigated_at"] or r["resolved_at"] or now) > window_start]
    return {
        "weeks": weeks,
        "window_days": window_days,
        "per_week": weekly_counts(tenant=tenant, since=since, now=now),
        "timings": figures,
        "availability": availability(tenant=tenant, rows=in_window, since=window_start, now=now),
    }
