"""Reads of the ops loop for pages, the API and incidents (drills): what the last health tick
found, and the stored SLI rows of a slot."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.models import QuerySet, Sum
from django.utils import timezone

from serving.ops import health
from serving.ops.health.state import health_keys, health_redis, loads
from serving.ops.models import Resolution, Rollback, Rollout, RolloutPolicy, SliSample
from serving.ops.sli_store import as_datetime
from serving.slo.counts import HISTOGRAM_SIZE, Counts

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


_HISTOGRAMS = ("latency", "ttft", "itl")
_SCALARS = ("requests", "errors", "rejected", "tokens_in", "tokens_out")
_FULL = " AND ".join(
    f"COALESCE(CASE WHEN jsonb_typeof({h}) = 'array' THEN jsonb_array_length({h}) END = %s, false)"
    for h in _HISTOGRAMS
)
_SEEK = (
    "(SELECT n.cumulative FROM serving_slisample n WHERE n.deployment_id = %s"
    ' AND n."group" = g.grp AND n.resolution = %s AND n.version = g.ver AND n.tenant_id = %s'
    ' AND n."end" {cond} ORDER BY n."end" DESC, n.id DESC LIMIT 1)'
)
# Names from this module only; every value is a parameter.
_WINDOW_SQL = (
    'WITH g AS (SELECT "group" AS grp, version AS ver, COUNT(*) AS n, '  # noqa: S608
    + ", ".join(f"SUM({s})" for s in _SCALARS)
    + ', SUM(GREATEST(EXTRACT(EPOCH FROM "end" - start), 0)) AS secs, BOOL_AND('
    + _FULL
    + ") AS full FROM serving_slisample WHERE tenant_id = %s AND deployment_id = %s"
    ' AND resolution = %s AND "end" >= %s AND "end" <= %s GROUP BY 1, 2)'
    " SELECT g.*, "
    + _SEEK.format(cond='>= %s AND n."end" <= %s')
    + ", "
    + _SEEK.format(cond="< %s")
    + " FROM g ORDER BY 1, 2"
)


@dataclass
class WindowSum:
    """A slot's rows of one version in a window, summed (`counts.seconds`: their spans)."""

    group: str
    version: str
    rows: int
    counts: Counts


def _histogram_sums(
    *, tenant_id: int, deployment_id: int, resolution: int, since: datetime, until: datetime
) -> dict[tuple[str, str], dict[str, list[int]]]:
    """Every (group, version)'s histograms summed element-wise in SQL; a row whose histogram
    is not a full list counts as zeros there."""
    sums = ", ".join(
        f"SUM(CASE WHEN jsonb_typeof({h}) = 'array' AND jsonb_array_length({h}) = {HISTOGRAM_SIZE}"
        f" THEN ({h}->>{i})::bigint ELSE 0 END)"
        for h in _HISTOGRAMS
        for i in range(HISTOGRAM_SIZE)
    )
    sql = (
        f'SELECT "group", version, {sums} FROM serving_slisample WHERE tenant_id = %s'  # noqa: S608
        ' AND deployment_id = %s AND resolution = %s AND "end" >= %s AND "end" <= %s GROUP BY 1, 2'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant_id, deployment_id, resolution, since, until])
        found = {}
        for group, version, *values in cursor.fetchall():
            found[(group, version)] = {
                h: [int(v or 0) for v in values[k * HISTOGRAM_SIZE : (k + 1) * HISTOGRAM_SIZE]]
                for k, h in enumerate(_HISTOGRAMS)
            }
    return found


def _subtracted(
    *, last: dict[str, Any], before: dict[str, Any], sums: dict[str, int]
) -> Counts | None:
    """newest − before-the-window cumulative totals, when they prove to be the rows' sum: every
    scalar equals the SQL sum (a restart in between, cumulative totals starting again from 0,
    breaks that) and no histogram bucket goes down; None otherwise."""
    newest, older = Counts.from_dict(last), Counts.from_dict(before)
    if any(getattr(newest, s) - getattr(older, s) != sums[s] for s in _SCALARS):
        return None
    data: dict[str, Any] = dict(sums)
    for name in _HISTOGRAMS:
        diff = [a - b for a, b in zip(getattr(newest, name), getattr(older, name), strict=True)]
        if any(v < 0 for v in diff):
            return None
        data[name] = diff
    return Counts.from_dict(data)


def sli_window_sums(
    *, tenant: Tenant, deployment: Deployment, resolution: int, since: datetime, until: datetime
) -> list[WindowSum]:
    """The deployment's stored rows at `resolution` ending in [since, until], summed per
    (group, version) — the same counts as adding every row's own deltas (a histogram stored
    as an empty list counts as zeros). Within an episode a row's cumulative totals are the
    previous row's plus its own deltas, so the sum is the newest row's totals minus those of
    the newest row of that version before `since` (two index seeks); where that does not hold
    (an episode restarted in the window, rows without histograms) the histograms are summed
    element-wise in SQL instead. Scalars and the spans are always summed in SQL."""
    params: list[Any] = [HISTOGRAM_SIZE] * len(_HISTOGRAMS)
    params += [tenant.pk, deployment.pk, resolution, since, until]
    params += [deployment.pk, resolution, tenant.pk, since, until]
    params += [deployment.pk, resolution, tenant.pk, since]
    with connection.cursor() as cursor:
        cursor.execute(_WINDOW_SQL, params)
        fetched = cursor.fetchall()
    out: list[WindowSum] = []
    missing: list[int] = []
    for group, version, rows, *rest in fetched:
        sums = {s: int(v or 0) for s, v in zip(_SCALARS, rest[:5], strict=True)}
        seconds, full, last, before = rest[5:]
        counts = None
        if full and last is not None:
            counts = _subtracted(last=_as_dict(last), before=_as_dict(before), sums=sums)
        if counts is None:
            missing.append(len(out))
            counts = Counts.from_dict(sums)
        counts.seconds = float(seconds or 0)
        out.append(WindowSum(group=group, version=version, rows=int(rows), counts=counts))
    if missing:
        histograms = _histogram_sums(
            tenant_id=tenant.pk,
            deployment_id=deployment.pk,
            resolution=resolution,
            since=since,
            until=until,
        )
        for index in missing:
            item = out[index]
            for name, values in histograms[(item.group, item.version)].items():
                setattr(item.counts, name, values)
    return out


def _as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


# A row that may start an episode (sli_episode_start, serving/migrations/0016): the same
# predicate, so the index answers it.
_STARTS = (
    "(NOT (r.cumulative ? 'requests' AND r.cumulative ? 'errors')"
    " OR r.cumulative -> 'requests' = r.requests::text::jsonb)"
)
_ENDS_SQL = (
    "SELECT d.id, g.grp, n.cumulative, f.cumulative, f.requests, f.errors, EXISTS (SELECT 1"  # noqa: S608
    ' FROM serving_slisample r WHERE r.deployment_id = d.id AND r."group" = g.grp'
    ' AND r.resolution = %(res)s AND ((r."end" > f."end" AND r."end" <= n."end" AND '
    + _STARTS
    + ') OR (r."end" = f."end" AND r.id <> f.id) OR (r."end" = n."end" AND r.id <> n.id)))'
    " FROM serving_deployment d CROSS JOIN unnest(%(groups)s::text[]) AS g(grp)"
    ' CROSS JOIN LATERAL (SELECT s.id, s."end", s.cumulative FROM serving_slisample s'
    ' WHERE s.deployment_id = d.id AND s."group" = g.grp AND s.resolution = %(res)s'
    ' AND s.tenant_id = %(tenant)s AND s."end" > %(since)s AND s."end" <= %(now)s'
    ' ORDER BY s."end" DESC LIMIT 1) n'
    ' CROSS JOIN LATERAL (SELECT s.id, s."end", s.cumulative, s.requests, s.errors'
    ' FROM serving_slisample s WHERE s.deployment_id = d.id AND s."group" = g.grp'
    ' AND s.resolution = %(res)s AND s.tenant_id = %(tenant)s AND s."end" > %(since)s'
    ' AND s."end" <= %(now)s ORDER BY s."end" ASC LIMIT 1) f'
    " WHERE d.tenant_id = %(tenant)s AND d.deleted_at IS NULL"
)


def window_request_totals(
    *, tenant: Tenant, since: datetime, now: datetime
) -> dict[int, tuple[int, int]]:
    """(requests, errors) of each live deployment of the tenant over its minute rows ending in
    (since, now] — the SUM of every row's own counts, without reading every row. Per slot
    (stable, canary): the newest row's cumulative totals minus the oldest one's, plus that
    oldest row's own counts, when no row between them may start an episode (index
    sli_episode_start: totals counted from 0 again, or no totals stored) — within an episode
    each row's totals are the previous row's plus its own counts. A deployment with any other
    slot (a restart in the window, rows without totals, two rows at one end) is summed in SQL."""
    params: dict[str, Any] = {
        "res": int(Resolution.MINUTE),
        "groups": ["stable", "canary"],
        "tenant": tenant.pk,
        "since": since,
        "now": now,
    }
    totals: dict[int, tuple[int, int]] = {}
    summed: set[int] = set()
    with connection.cursor() as cursor:
        cursor.execute(_ENDS_SQL, params)
        for dep, _group, newest, first, requests, errors, restarted in cursor.fetchall():
            last, oldest = _as_dict(newest), _as_dict(first)
            found = [last.get(k) for k in ("requests", "errors")]
            found += [oldest.get(k) for k in ("requests", "errors")]
            values = [v for v in found if type(v) is int]
            if restarted or len(values) != len(found):
                summed.add(dep)
                continue
            before = totals.get(dep, (0, 0))
            totals[dep] = (
                before[0] + values[0] - values[2] + requests,
                before[1] + values[1] - values[3] + errors,
            )
    if summed:
        rows = SliSample.objects.filter(
            tenant=tenant,
            deployment_id__in=summed,
            resolution=Resolution.MINUTE,
            end__gt=since,
            end__lte=now,
        )
        for dep in summed:
            totals.pop(dep, None)
        for row in rows.values("deployment_id").annotate(r=Sum("requests"), e=Sum("errors")):
            totals[row["deployment_id"]] = (int(row["r"] or 0), int(row["e"] or 0))
    return totals
