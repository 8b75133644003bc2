"""Stored SLI windows: turning the replicas' cumulative counters into per-slot deltas, and
window sums as one subtraction of cumulative totals (`Counts(now) - Counts(now - W)`).

Rows hold each slot's cumulative totals at their `end`, so the counts of any window are the
newest totals minus the totals of the newest row at or before the window's start: one index
seek per slot and window (raw rows for windows up to an hour, minute rows beyond).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import nullcontext
from datetime import UTC, datetime
from typing import Any

from django.db import connection, models

from serving.ops.models import Resolution, SliSample
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
    slots: Mapping[Slot, Episode],
    cutoffs: Mapping[int, float],
    only: Mapping[int, set[Slot]] | None = None,
) -> dict[Slot, dict[int, Counts]]:
    """For every slot and window length W (cutoff = now - W): the cumulative totals of the
    newest row of the slot's current episode (its version, since it started serving there)
    ending at or before the cutoff; absent when the episode is younger than W (its window then
    covers everything since it started). Cumulative totals restart with each episode.
    `only[W]`, where given, limits window W to those slots."""
    ordered = sorted(slots.items())
    found: dict[Slot, dict[int, Counts]] = {slot: {} for slot, _ in ordered}
    if not ordered or not cutoffs:
        return found
    parts: list[str] = []
    params: list[Any] = []
    for window, cutoff in sorted(cutoffs.items()):
        wanted = [(s, e) for s, e in ordered if only is None or s in only.get(window, ())]
        if not wanted:
            continue
        deployment_ids = [d for (d, _), _ in wanted]
        groups = [g for (_, g), _ in wanted]
        versions = [v[:64] for _, (v, _) in wanted]
        since = [as_datetime(t) for _, (_, t) in wanted]
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
            window,
            deployment_ids,
            groups,
            versions,
            since,
            int(resolution),
            as_datetime(cutoff),
        ]
    if not parts:
        return found
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        for dep, grp, window, cumulative in cursor.fetchall():
            value = cumulative if isinstance(cumulative, dict) else _json(cumulative)
            found[(dep, grp)][window] = Counts.from_dict(value)
    return found


def _json(raw: Any) -> dict[str, Any]:
    value = json.loads(raw)
    return value if isinstance(value, dict) else {}


class BoundaryCache:
    """Boundaries of the windows summed from minute rows (longer than an hour), kept between
    ticks in the worker's memory. Minute rows end on the minute, and those before such a
    window's cutoff were all written long ago, so the newest one at or before `now - W` is the
    same until the cutoff crosses the next minute: one lookup a minute instead of one a tick.
    Keyed by the slot's episode, so a new version or a canary that came back looks up afresh;
    each tick keeps the entries it used and those still current of slots it did not look up."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Slot, int], tuple[Episode, int, Counts | None]] = {}

    def clear(self) -> None:
        self._entries.clear()

    def lookup(
        self, slots: Mapping[Slot, Episode], cutoffs: Mapping[int, float]
    ) -> dict[Slot, dict[int, Counts]]:
        """As `lookup_before`, asking the database only for what the cache cannot answer."""
        minute = {w: int(c // 60) for w, c in cutoffs.items() if w > RAW_WINDOW_MAX_S}
        known: dict[Slot, dict[int, Counts | None]] = {slot: {} for slot in slots}
        only: dict[int, set[Slot]] = {w: set(slots) for w in cutoffs if w not in minute}
        for window, bucket in minute.items():
            for slot, episode in slots.items():
                hit = self._entries.get((slot, window))
                if hit is not None and hit[0] == episode and hit[1] == bucket:
                    known[slot][window] = hit[2]
                else:
                    only.setdefault(window, set()).add(slot)
        found = lookup_before(slots, cutoffs, only=only)
        entries: dict[tuple[Slot, int], tuple[Episode, int, Counts | None]] = {}
        for slot, episode in slots.items():
            for window, bucket in minute.items():
                value = known[slot][window] if window in known[slot] else found[slot].get(window)
                entries[(slot, window)] = (episode, bucket, value)
                if value is not None:
                    found[slot][window] = value
        # A slot not evaluated this tick (not due: a canary's deployment is checked more often
        # than its neighbours) keeps its entries while their minute lasts; a gone slot's go
        # with it.
        kept = {
            key: entry
            for key, entry in self._entries.items()
            if key[0] not in slots and key[1] in minute and entry[1] == minute[key[1]]
        }
        self._entries = {**kept, **entries}
        return found


BOUNDARIES = BoundaryCache()


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


def insert_samples(rows: list[SliSample]) -> None:
    """Store one tick's rows in one statement: COPY (a tenth of the time of a 1,500-row INSERT
    with 28,500 parameters)."""
    if not rows:
        return
    fields = [f for f in SliSample._meta.concrete_fields if not f.primary_key]
    json_fields = {f.attname for f in fields if isinstance(f, models.JSONField)}
    columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in fields)
    sql = f"COPY {SliSample._meta.db_table} ({columns}) FROM STDIN"
    names = [f.attname for f in fields]
    with connection.cursor() as cursor:
        # Logged like any statement, so query counts (CaptureQueriesContext) see it.
        debug = cursor.debug_sql(sql) if hasattr(cursor, "debug_sql") else nullcontext()
        with debug, connection.wrap_database_errors, cursor.cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(
                    [
                        json.dumps(getattr(row, n), separators=(",", ":"))
                        if n in json_fields
                        else getattr(row, n)
                        for n in names
                    ]
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
