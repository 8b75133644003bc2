"""Stored SLI windows: turning the replicas' cumulative counters into per-slot deltas, and
window sums as one subtraction of cumulative totals (`Counts(now) - Counts(now - W)`).

Rows hold each slot's cumulative totals at their `end`, so the counts of any window are the
newest totals minus the totals of the newest row at or before the window's start: one index
seek per slot and window (raw rows for windows up to an hour, minute rows beyond).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.db import connection

from serving.ops_models import Resolution, SliSample
from serving.slo.evaluate import Counts

RAW_WINDOW_MAX_S = 3600  # windows up to an hour are summed from raw rows
RAW_RETENTION_S = RAW_WINDOW_MAX_S + 600  # raw rows kept an hour (and a margin for lookups)
MINUTE_RETENTION_S = 30 * 86400  # minute rows for 30 days

Slot = tuple[int, str]  # (deployment id, group)


def counts_of_totals(totals: Mapping[str, Any]) -> Counts:
    """A replica's published `totals` (serving.dataplane.sli.SliWindow.as_dict) as Counts."""
    return Counts.from_dict(totals)  # reads `latency_ms` etc. as published


def replica_delta(now: Counts, before: Counts | None) -> Counts:
    """What a replica counted since it was last read; a new replica counts from zero."""
    if before is None or now.requests < before.requests:  # new, or restarted under one id
        return now
    return now - before


def as_datetime(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


Episode = tuple[str, float]  # (version label, since): a slot's counters restart with each


def lookup_before(
    slots: Mapping[Slot, Episode], cutoffs: Mapping[int, float]
) -> dict[Slot, dict[int, Counts]]:
    """For every slot and window length W (cutoff = now - W): the cumulative totals of the
    newest row of the slot's current episode (its version, since it started serving there)
    ending at or before the cutoff; absent when the episode is younger than W (its window then
    covers everything since it started). Cumulative totals restart with each episode."""
    ordered = sorted(slots.items())
    found: dict[Slot, dict[int, Counts]] = {slot: {} for slot, _ in ordered}
    if not ordered or not cutoffs:
        return found
    deployment_ids = [d for (d, _), _ in ordered]
    groups = [g for (_, g), _ in ordered]
    versions = [v[:64] for _, (v, _) in ordered]
    since = [as_datetime(t) for _, (_, t) in ordered]
    if connection.vendor == "postgresql":
        parts: list[str] = []
        params: list[Any] = []
        for window, cutoff in sorted(cutoffs.items()):
            resolution = Resolution.RAW if window <= RAW_WINDOW_MAX_S else Resolution.MINUTE
            parts.append(
                "SELECT s.dep, s.grp, %s AS win, x.cumulative FROM unnest(%s::bigint[],"
                " %s::text[], %s::text[], %s::timestamptz[]) AS s(dep, grp, ver, since)"
                " CROSS JOIN LATERAL (SELECT cumulative FROM serving_slisample"
                ' WHERE deployment_id = s.dep AND "group" = s.grp AND version = s.ver'
                ' AND resolution = %s AND "end" >= s.since AND "end" <= %s'
                ' ORDER BY "end" DESC LIMIT 1) x'
            )
            params += [
                window, deployment_ids, groups, versions, since, int(resolution),
                as_datetime(cutoff),
            ]  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(" UNION ALL ".join(parts), params)
            for dep, grp, window, cumulative in cursor.fetchall():
                value = cumulative if isinstance(cumulative, dict) else _json(cumulative)
                found[(dep, grp)][window] = Counts.from_dict(value)
        return found
    # Embedded mode (SQLite, a handful of deployments): one small query per slot and window.
    for slot, (version, started) in ordered:
        for window, cutoff in cutoffs.items():
            resolution = Resolution.RAW if window <= RAW_WINDOW_MAX_S else Resolution.MINUTE
            row = (
                SliSample.objects.filter(
                    deployment_id=slot[0],
                    group=slot[1],
                    version=version[:64],
                    resolution=resolution,
                    end__gte=as_datetime(started),
                    end__lte=as_datetime(cutoff),
                )  # fmt: skip
                .order_by("-end")
                .values_list("cumulative", flat=True)
                .first()
            )
            if row is not None:
                found[slot][window] = Counts.from_dict(row)
    return found


def _json(raw: Any) -> dict[str, Any]:
    import json

    value = json.loads(raw)
    return value if isinstance(value, dict) else {}


def sample_row(
    *,
    tenant_id: int,
    slot: Slot,
    version: str,
    resolution: int,
    start: float,
    end: float,
    delta: Counts,
    cumulative: Counts,
    probe: tuple[bool | None, float | None] = (None, None),
    kv: Mapping[str, Any] | None = None,
) -> SliSample:
    return SliSample(
        tenant_id=tenant_id,
        deployment_id=slot[0],
        group=slot[1],
        version=version[:64],
        resolution=resolution,
        start=as_datetime(start),
        end=as_datetime(end),
        requests=delta.requests,
        errors=delta.errors,
        rejected=delta.rejected,
        tokens_in=delta.tokens_in,
        tokens_out=delta.tokens_out,
        latency=list(delta.latency),
        ttft=list(delta.ttft),
        itl=list(delta.itl),
        cumulative=cumulative.to_dict(),
        probe_ok=probe[0],
        probe_ms=probe[1],
        kv=dict(kv or {}),
    )


def prune(*, now: float) -> dict[str, int]:
    """Drop raw rows older than an hour and minute rows older than 30 days."""
    raw, _ = SliSample.objects.filter(
        resolution=Resolution.RAW, end__lt=as_datetime(now - RAW_RETENTION_S)
    ).delete()
    minute, _ = SliSample.objects.filter(
        resolution=Resolution.MINUTE, end__lt=as_datetime(now - MINUTE_RETENTION_S)
    ).delete()
    return {"raw": raw, "minute": minute}
