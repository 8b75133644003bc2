"""The signals around an incident (SLI samples, breaches, rollouts, reconcile runs), reduced to
named numbers and flags that the root-cause rules in `incidents.hints` match against.

A signal that cannot be measured (no samples, no traffic before the window) is left out, so
rules on it do not match. The KV counters in `SliSample.kv` (preemptions, evictions,
replica_restarts) are the replicas' cumulative counters: their increase in the window is the
sum of the positive steps between consecutive samples (a replica restart resets them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from incidents.models import BreachGroup, Incident, SlaBreach
from incidents.rca.symptoms import (
    SYMPTOM_LABELS,
    SymptomItem,
    items_of,
    serve_messages,
    symptom_counts,
)
from serving.dataplane.sli import BOUNDS_MS, quantile
from serving.deployments.models import ReconcileRun
from serving.ops.models import Rollout, SliSample
from serving.ops.selectors import sli_samples_between
from tenants.models import Tenant

BEFORE = timedelta(minutes=15)  # the window opens this long before the incident triggered
BASELINE = timedelta(hours=1)  # request rate before the window, for request_rate_ratio
GROUPS = ("stable", "canary")

SIGNAL_NAMES = (
    "error_ratio_stable",
    "error_ratio_canary",
    "canary_error_ratio_vs_stable",
    "latency_p95_ms_stable",
    "latency_p95_ms_canary",
    "canary_latency_p95_vs_stable",
    "kv_usage",
    "preemptions",
    "evictions",
    "fragmentation",
    "replica_restarts",
    "request_rate_ratio",
    "rejected_ratio",
    "canary_involved",
    "reconcile_p95_ms",
    "reconcile_failures",
    "gpu_memory_growth_mb_per_min",
    # How many of Serve's and the replicas' messages show a symptom (incidents.rca.symptoms).
    *(f"serve_{name}" for name in SYMPTOM_LABELS),
)

Signals = dict[str, float | bool]


def incident_window(incident: Incident, now: datetime | None = None) -> tuple[datetime, datetime]:
    end = incident.resolved_at or now or timezone.now()
    return incident.triggered_at - BEFORE, max(end, incident.triggered_at)


def _sum_hist(histograms: Iterable[Sequence[int]]) -> list[int]:
    total = [0] * (len(BOUNDS_MS) + 1)
    for hist in histograms:
        for index, count in enumerate(list(hist)[: len(total)]):
            total[index] += int(count)
    return total


def p95_ms(histograms: Iterable[Sequence[int]]) -> float | None:
    value = quantile(_sum_hist(histograms), 0.95)
    if value is None:
        return None
    # The overflow bucket has no upper bound: report the last bound (a lower bound of p95).
    return float(BOUNDS_MS[-1]) if value == float("inf") else value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _increase(series: Sequence[float]) -> float:
    """Increase of a cumulative counter (reset-safe: only positive steps count)."""
    return sum(max(0.0, b - a) for a, b in zip(series, series[1:], strict=False))


def _series(samples: Sequence[SliSample], group: str, key: str) -> list[tuple[datetime, float]]:
    """(end, value) of one KV stat of one group, in time order, where the sample has it."""
    points = []
    for sample in samples:
        value = _number(sample.kv.get(key)) if isinstance(sample.kv, dict) else None
        if sample.group == group and value is not None:
            points.append((sample.end, value))
    return points


def _rate(samples: Sequence[SliSample]) -> float | None:
    """Requests per second over the time the samples cover (the union of their intervals:
    the stable and canary rows of one tick cover the same seconds once)."""
    covered, reach = 0.0, None
    for sample in sorted(samples, key=lambda s: s.start):
        start = sample.start if reach is None else max(sample.start, reach)
        if sample.end > start:
            covered += (sample.end - start).total_seconds()
        reach = sample.end if reach is None else max(reach, sample.end)
    return sum(s.requests for s in samples) / covered if covered > 0 else None


def _slope_per_minute(points: Sequence[tuple[datetime, float]]) -> float | None:
    """Least-squares slope of (time, value) in value per minute; None under three points."""
    if len(points) < 3:
        return None
    xs = [(t - points[0][0]).total_seconds() / 60.0 for t, _ in points]
    ys = [v for _, v in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var


def sli_signals(samples: Sequence[SliSample], baseline: Sequence[SliSample]) -> Signals:
    """Signals of the SLI samples in the window (`baseline`: the hour before it)."""
    out: Signals = {}
    for group in GROUPS:
        rows = [s for s in samples if s.group == group]
        requests = sum(s.requests for s in rows)
        if requests:
            out[f"error_ratio_{group}"] = sum(s.errors for s in rows) / requests
        p95 = p95_ms(s.latency for s in rows)
        if p95 is not None:
            out[f"latency_p95_ms_{group}"] = p95
    if "error_ratio_canary" in out and "error_ratio_stable" in out:
        stable = max(float(out["error_ratio_stable"]), 0.001)  # a floor: 0 errors is no divisor
        out["canary_error_ratio_vs_stable"] = float(out["error_ratio_canary"]) / stable
    if "latency_p95_ms_canary" in out and "latency_p95_ms_stable" in out:
        out["canary_latency_p95_vs_stable"] = float(out["latency_p95_ms_canary"]) / max(
            float(out["latency_p95_ms_stable"]), 1.0
        )
    requests = sum(s.requests for s in samples)
    if requests:
        out["rejected_ratio"] = sum(s.rejected for s in samples) / requests
    usage: list[float] = []
    for group in GROUPS:
        used = dict(_series(samples, group, "blocks_used"))
        total = dict(_series(samples, group, "blocks_total"))
        usage.extend(used[at] / total[at] for at in used if total.get(at))
    if usage:
        out["kv_usage"] = max(usage)
    fragmentation = [v for g in GROUPS for _, v in _series(samples, g, "fragmentation")]
    if fragmentation:
        out["fragmentation"] = max(fragmentation)
    for counter in ("preemptions", "evictions", "replica_restarts"):
        total_increase, seen = 0.0, False
        for group in GROUPS:
            series = [v for _, v in _series(samples, group, counter)]
            if series:
                seen = True
                total_increase += _increase(series)
        if seen:
            out[counter] = total_increase
    # GPU memory per slot, once the GPU agent stores it in the samples (`gpu_memory_mb`).
    slopes = []
    for group in GROUPS:
        points = _series(samples, group, "gpu_memory_mb")
        if (slope := _slope_per_minute(points)) is not None:
            slopes.append(slope)
    if slopes:
        out["gpu_memory_growth_mb_per_min"] = max(slopes)
    now_rate, before_rate = _rate(samples), _rate(baseline)
    if now_rate is not None and before_rate:
        out["request_rate_ratio"] = now_rate / before_rate
    return out


def reconcile_signals(runs: Sequence[Any]) -> Signals:
    """p95 duration and failures of the reconcile runs (platform-wide) in the window."""
    out: Signals = {}
    durations = sorted(float(r.duration_ms) for r in runs if r.duration_ms is not None)
    if durations:
        out["reconcile_p95_ms"] = durations[min(len(durations) - 1, int(0.95 * len(durations)))]
    finished = [r for r in runs if r.finished_at is not None or r.error]
    if finished:
        out["reconcile_failures"] = float(sum(1 for r in finished if not r.ok))
    return out


def incident_signals(*, tenant: Tenant, incident: Incident) -> Signals:
    """Every signal around `incident`: [triggered_at - 15 min, resolved_at or now]."""
    return incident_evidence(tenant=tenant, incident=incident)[0]


def incident_evidence(*, tenant: Tenant, incident: Incident) -> tuple[Signals, list[SymptomItem]]:
    """The signals around `incident` and the Serve symptoms among them, one read of each."""
    start, end = incident_window(incident)
    signals: Signals = {}
    if "breaches" in getattr(incident, "_prefetched_objects_cache", {}):  # the detail views'
        breaches = [b for b in incident.breaches.all() if b.tenant_id == tenant.pk]
    else:
        breaches = list(
            SlaBreach.objects.filter(tenant=tenant, incident=incident).only(
                "tenant_id", "group", "kind", "detail", "observed", "detected_at"
            )
        )
    canary = any(b.group == BreachGroup.CANARY for b in breaches)
    if incident.deployment_id is not None:
        samples = sli_samples_between(
            tenant=tenant, deployment_id=incident.deployment_id, start=start, end=end
        )
        baseline = sli_samples_between(
            tenant=tenant, deployment_id=incident.deployment_id, start=start - BASELINE, end=start
        )
        baseline = [s for s in baseline if s.end <= start]
        signals.update(sli_signals(samples, baseline))
        canary = (
            canary
            or Rollout.objects.filter(tenant=tenant, deployment_id=incident.deployment_id)
            .filter(started_at__lte=end)
            .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=start))
            .exists()
        )
    if incident.rollback_id is not None and incident.rollback is not None:
        canary = canary or incident.rollback.rollout_id is not None
    signals["canary_involved"] = canary
    runs = ReconcileRun.objects.filter(started_at__gte=start, started_at__lte=end)
    signals.update(reconcile_signals(list(runs.only("duration_ms", "ok", "finished_at", "error"))))
    messages = serve_messages(
        tenant=tenant, incident=incident, start=start, end=end, breaches=breaches
    )
    items = items_of(messages)
    signals.update(symptom_counts(items))
    return signals, items
