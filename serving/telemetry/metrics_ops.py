"""/metrics: the control loop's work, read at scrape time from where it is recorded, so every
web process exports the same numbers: rollbacks and reconciles (their rows, aggregated in SQL:
a counter goes down only if rows are deleted, which Prometheus reads as a reset), the health
tick's durations (a histogram the tick adds to in Redis), the Celery queues' depths (the
broker's lists), the HTTP requests of every web process (portal.http_metrics) and the Serve API
guard of every process (with the reconciles: serving.deployments.controlplane)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.db.models import (
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    Q,
    Sum,
    Value,
    When,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from portal import http_metrics
from serving.deployments import controlplane
from serving.deployments.models import ReconcileRun
from serving.ops.health import TICK_BUCKETS_S, tick_stats
from serving.ops.models import Rollback, RollbackStatus

ROLLBACK_BUCKETS_S = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
RECONCILE_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
FINISHED = (RollbackStatus.DONE, RollbackStatus.FAILED)


def _cumulative(bounds: Sequence[float], counts: Sequence[float]) -> list[tuple[str, float]]:
    """Histogram buckets from per-bucket counts (the last one above every bound)."""
    out, running = [], 0.0
    for bound, count in zip([*map(floatToGoString, bounds), "+Inf"], counts, strict=True):
        running += count
        out.append((bound, running))
    return out


def _buckets_of(row: Mapping[str, Any], bounds: Sequence[float]) -> list[tuple[str, float]]:
    """Buckets from SQL counts that are already cumulative (`le0`, `le1`, ... and `count`)."""
    values = [float(row[f"le{i}"]) for i in range(len(bounds))] + [float(row["count"])]
    return list(zip([*map(floatToGoString, bounds), "+Inf"], values, strict=True))


def _le_counts(duration: str, bounds: Sequence[float], scale: Any) -> dict[str, Any]:
    return {
        f"le{i}": Count("id", filter=Q(**{f"{duration}__lte": scale(bound)}))
        for i, bound in enumerate(bounds)
    }


class RollbackCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        requested = CounterMetricFamily(
            "portal_rollbacks",
            "Rollbacks requested, by what triggered them (breach, analysis, manual, ...).",
            labels=["tenant", "deployment", "trigger"],
        )
        finished = CounterMetricFamily(
            "portal_rollbacks_finished",
            "Rollbacks finished, by outcome (done: traffic is back; failed).",
            labels=["tenant", "deployment", "outcome"],
        )
        running = GaugeMetricFamily(
            "portal_rollbacks_in_progress",
            "Rollbacks pending or switching traffic now.",
            labels=["tenant", "deployment"],
        )
        counts = (
            Rollback.objects.values("tenant__slug", "deployment__name", "trigger", "status")
            .annotate(n=Count("id"))
            .order_by("tenant__slug", "deployment__name", "trigger", "status")
        )
        by: dict[str, dict[tuple[str, ...], float]] = {"trigger": {}, "done": {}, "running": {}}
        for row in counts:
            owner = (row["tenant__slug"], row["deployment__name"])
            trigger = (*owner, row["trigger"])
            by["trigger"][trigger] = by["trigger"].get(trigger, 0) + row["n"]
            if row["status"] in FINISHED:
                by["done"][(*owner, row["status"])] = float(row["n"])
            else:
                by["running"][owner] = by["running"].get(owner, 0) + row["n"]
        for labels, n in by["trigger"].items():
            requested.add_metric(list(labels), n)
        for labels, n in by["done"].items():
            finished.add_metric(list(labels), n)
        for labels, n in by["running"].items():
            running.add_metric(list(labels), n)
        yield from (requested, finished, running)
        yield self._durations()

    def _durations(self) -> Metric:
        family = HistogramMetricFamily(
            "portal_rollback_duration_seconds",
            "Finished rollbacks, from the breach's detection (or the request) to the end.",
            labels=["tenant", "outcome"],
        )
        took = ExpressionWrapper(F("finished_at") - F("detected_at"), output_field=DurationField())
        rows = (
            Rollback.objects.filter(status__in=FINISHED, finished_at__isnull=False)
            .annotate(took=took)
            .values("tenant__slug", "status")
            .annotate(
                count=Count("id"),
                total=Sum("took"),
                **_le_counts("took", ROLLBACK_BUCKETS_S, lambda s: timedelta(seconds=s)),
            )
            .order_by("tenant__slug", "status")
        )
        for row in rows:
            total = row["total"].total_seconds() if row["total"] is not None else 0.0
            buckets = _buckets_of(row, ROLLBACK_BUCKETS_S)
            family.add_metric([row["tenant__slug"], row["status"]], buckets, total)
        return family


class ReconcileCollector(Collector):
    """Finished ReconcileRun rows: applied (Serve took every change), partial (Serve refused
    some applications, the rest applied), skipped (nothing changed), failed."""

    def collect(self) -> Iterator[Metric]:
        outcome = Case(
            When(ok=False, then=Value("failed")),
            When(skipped=True, then=Value("skipped")),
            When(~Q(error=""), then=Value("partial")),
            default=Value("applied"),
        )
        rows = (
            ReconcileRun.objects.filter(finished_at__isnull=False, duration_ms__isnull=False)
            .annotate(outcome=outcome)
            .values("outcome")
            .annotate(
                count=Count("id"),
                total=Sum("duration_ms"),
                last=Max("finished_at"),
                **_le_counts("duration_ms", RECONCILE_BUCKETS_S, lambda s: s * 1000),
            )
            .order_by("outcome")
        )
        total = CounterMetricFamily(
            "portal_reconciles", "Reconciles of Serve's config, by outcome.", labels=["outcome"]
        )
        durations = HistogramMetricFamily(
            "portal_reconcile_duration_seconds",
            "How long each reconcile took, by outcome.",
            labels=["outcome"],
        )
        last = GaugeMetricFamily(
            "portal_reconcile_last_finished_timestamp_seconds",
            "When the newest reconcile of each outcome finished (Unix time).",
            labels=["outcome"],
        )
        for row in rows:
            total.add_metric([row["outcome"]], float(row["count"]))
            buckets = _buckets_of(row, RECONCILE_BUCKETS_S)
            durations.add_metric([row["outcome"]], buckets, float(row["total"] or 0) / 1000)
            last.add_metric([row["outcome"]], row["last"].timestamp())
        yield from (total, durations, last)
        yield from control_plane_families(controlplane.guard_snapshots())


_GUARD_COUNTERS = {
    "requests": "Serve API requests asked for (each caller's call once, retries not counted).",
    "http_calls": "HTTP calls the Serve API client made (first attempts, retries and probes).",
    "retries": "Serve API calls retried within the retry budget.",
    "retries_denied": "Serve API retries the budget refused (a retry storm avoided).",
    "rejected": "Serve API requests refused at once because the circuit breaker was open.",
    "breaker_opened": "Times the Serve API circuit breaker opened.",
}


def control_plane_families(snapshots: Sequence[Mapping[str, Any]]) -> list[Metric]:
    """The Serve API guard of every process that calls Serve (serving.control.breaker, published
    by serving.deployments.controlplane): breaker state, counts, recent latency."""
    labels = ["process", "endpoint"]
    state = GaugeMetricFamily(
        "portal_serve_api_breaker_state",
        "1 for the Serve API circuit breaker's current state (closed, open, half_open).",
        labels=[*labels, "state"],
    )
    counters = {
        name: CounterMetricFamily(f"portal_serve_api_{name}", doc, labels=labels)
        for name, doc in _GUARD_COUNTERS.items()
    }
    latency = GaugeMetricFamily(
        "portal_serve_api_latency_seconds",
        "Recent Serve API call latency (last, p50 and max of the last 50 calls).",
        labels=[*labels, "stat"],
    )
    tokens = GaugeMetricFamily(
        "portal_serve_api_retry_tokens", "Retries the budget allows now.", labels=labels
    )
    for snap in snapshots:
        key = [str(snap["process"]), str(snap["endpoint"])]
        for name in ("closed", "open", "half_open"):
            state.add_metric([*key, name], 1.0 if snap["state"] == name else 0.0)
        for name, family in counters.items():
            family.add_metric(
                key, float(snap.get("opened" if name == "breaker_opened" else name, 0))
            )
        for stat in ("last", "p50", "max"):
            if snap.get(f"latency_{stat}_s") is not None:
                latency.add_metric([*key, stat], float(snap[f"latency_{stat}_s"]))
        tokens.add_metric(key, float(snap.get("retry_tokens", 0)))
    return [state, *counters.values(), latency, tokens]


class HealthTickCollector(Collector):
    """The health ticks' durations, whichever worker ran them (serving.ops.health)."""

    def __init__(self, redis_client: Any = None) -> None:
        self.redis_client = redis_client

    def collect(self) -> Iterator[Metric]:
        stats = tick_stats(self.redis_client)
        durations = HistogramMetricFamily(
            "portal_health_tick_duration_seconds",
            "How long each health tick took (probes, SLI reads, evaluation, actions).",
        )
        durations.add_metric([], _cumulative(TICK_BUCKETS_S, stats["buckets"]), stats["sum"])
        skipped = CounterMetricFamily(
            "portal_health_ticks_skipped",
            "Health ticks that found another tick running and did nothing.",
            value=stats["skipped"],
        )
        last = GaugeMetricFamily(
            "portal_health_tick_last_duration_seconds", "How long the newest health tick took."
        )
        ended = GaugeMetricFamily(
            "portal_health_tick_last_timestamp_seconds", "When the newest health tick ended."
        )
        if stats["last"] is not None:
            last.add_metric([], stats["last"])
            ended.add_metric([], stats["last_at"])
        yield from (durations, skipped, last, ended)


def queue_keys(queue: str, transport_options: dict[str, Any]) -> list[str]:
    """The broker's Redis lists of one Celery queue: one per priority step (kombu's layout;
    a message without a priority is in the queue's own name)."""
    from kombu.transport.redis import PRIORITY_STEPS, Channel

    prefix = str(transport_options.get("global_keyprefix", ""))
    sep = str(transport_options.get("sep", Channel.sep))
    steps = transport_options.get("priority_steps", PRIORITY_STEPS)
    return [f"{prefix}{queue}"] + [f"{prefix}{queue}{sep}{step}" for step in steps if step]


class CeleryQueueCollector(Collector):
    def __init__(self, redis_client: Any = None) -> None:
        self.redis_client = redis_client

    def collect(self) -> Iterator[Metric]:
        from portal.celery import QUEUES, app

        family = GaugeMetricFamily(
            "portal_celery_queue_length",
            "Messages waiting in each Celery queue of the Redis broker (not yet taken by a "
            "worker).",
            labels=["queue"],
        )
        url = str(app.conf.broker_url or "")
        if self.redis_client is None and not url.startswith(("redis://", "rediss://", "unix:")):
            yield family  # another broker: its depth is not readable here
            return
        options = dict(app.conf.broker_transport_options or {})
        keys = {queue: queue_keys(queue, options) for queue in QUEUES}
        lengths = iter(self._lengths(url, [key for queue in QUEUES for key in keys[queue]]))
        for queue in QUEUES:
            family.add_metric([queue], float(sum(next(lengths) for _ in keys[queue])))
        yield family

    def _lengths(self, url: str, keys: list[str]) -> list[int]:
        import redis

        own = self.redis_client is None
        r = redis.Redis.from_url(url) if own else self.redis_client
        try:
            with r.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.llen(key)
                return [int(n) for n in pipe.execute()]
        finally:
            if own:
                r.close()


class HttpCollector(Collector):
    def __init__(self, redis_client: Any = None) -> None:
        self.redis_client = redis_client

    def collect(self) -> Iterator[Metric]:
        labels = ["method", "route", "status"]
        total = CounterMetricFamily(
            "portal_http_requests",
            "HTTP requests every web process answered, by method, route name and status class.",
            labels=labels,
        )
        durations = HistogramMetricFamily(
            "portal_http_request_duration_seconds",
            "Time to the response, by method, route name and status class (every web process).",
            labels=labels,
        )
        http_metrics.flush(force=True)  # this process's last second too
        totals = http_metrics.http_totals(self.redis_client)
        for key, row in sorted(totals.items()):
            total.add_metric(list(key), float(row.count))
            buckets = _cumulative(http_metrics.BUCKETS_S, row.buckets)
            durations.add_metric(list(key), buckets, row.sum)
        yield from (total, durations)
