"""The compare page's window sums in the database (serving.ops.selectors.sli_window_sums): the
same arms as adding every stored row's own deltas (compare.arms_of), on rows written as the
health tick writes them (sli_store.sample_row, cumulative totals chained within an episode),
with the cumulative subtraction taken where it holds and the SQL sums where it does not (an
episode restarted in the window, rows stored without histograms, rows without totals). The
analytics page's request totals and the health chart's buckets likewise."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from serving.deployments.models import Deployment
from serving.ops import selectors
from serving.ops.models import Resolution, SliSample
from serving.ops.series import bucket_sums
from serving.ops.sli_store import insert_samples, sample_row
from serving.ops.views import health as health_views
from serving.ops.views.compare import arms_of, arms_of_sums
from serving.ops.views.health import sli_series
from serving.slo.counts import HISTOGRAM_SIZE, Counts
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _delta(rng: random.Random) -> Counts:
    requests = rng.randint(0, 50)
    errors = rng.randint(0, requests)
    hist = [[0] * HISTOGRAM_SIZE for _ in range(3)]
    for h in hist:
        for _ in range(requests):
            h[rng.randrange(HISTOGRAM_SIZE)] += 1
    return Counts(
        requests=requests,
        errors=errors,
        rejected=rng.randint(0, requests - errors),
        tokens_in=rng.randint(0, 999),
        tokens_out=rng.randint(0, 999),
        latency=hist[0],
        ttft=hist[1],
        itl=hist[2],
        seconds=60.0,
    )


def _episode(
    deployment: Deployment,
    group: str,
    version: str,
    minutes: range,
    now: datetime,
    rng: random.Random,
) -> list[SliSample]:
    """Minute rows of one episode: cumulative totals from 0, each the last plus its deltas."""
    rows, cumulative = [], Counts()
    base = now.timestamp() // 60 * 60
    for minute in minutes:
        delta = _delta(rng)
        cumulative = cumulative + delta
        end = base - 60 * minute
        rows.append(
            sample_row(
                tenant_id=deployment.tenant_id,
                slot=(deployment.pk, group),
                version=version,
                resolution=Resolution.MINUTE,
                start=end - 60,
                end=end,
                delta=delta,
                cumulative=cumulative,
            )
        )
    return rows


def _both(deployment: Deployment, seconds: int, versions: dict[str, str | None]) -> tuple[Any, Any]:
    until = timezone.now()
    since = until - timedelta(seconds=seconds)
    rows = SliSample.objects.filter(
        deployment=deployment, resolution=Resolution.MINUTE, end__gte=since, end__lte=until
    ).order_by("end")
    plain = arms_of(rows.iterator(), versions)
    sums = selectors.sli_window_sums(
        tenant=deployment.tenant,
        deployment=deployment,
        resolution=Resolution.MINUTE,
        since=since,
        until=until,
    )
    return plain, arms_of_sums(sums, versions)


def _spy(monkeypatch: Any) -> list[int]:
    calls: list[int] = []
    original = selectors._histogram_sums

    def counted(**kwargs: Any) -> Any:
        calls.append(1)
        return original(**kwargs)

    monkeypatch.setattr(selectors, "_histogram_sums", counted)
    return calls


def test_one_episode_is_the_cumulative_subtraction_and_equals_the_row_sum(
    world_a: TenantWorld, monkeypatch: Any
) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    rng, now = random.Random(7), timezone.now()
    rows = _episode(deployment, "stable", "m:v1", range(300, 0, -1), now, rng)
    rows += _episode(deployment, "canary", "m:v2", range(200, 0, -1), now, rng)
    insert_samples(rows)
    versions: dict[str, str | None] = {"stable": "m:v1", "canary": "m:v2"}
    calls = _spy(monkeypatch)
    for seconds in (600, 3600, 4 * 3600, 86400):  # inside the history, and all of it
        plain, summed = _both(deployment, seconds, versions)
        assert summed == plain and set(plain) == {"stable", "canary"}
        assert summed["stable"].counts.requests > 0
    assert calls == []  # every window was a subtraction


def test_a_restarted_episode_other_versions_and_rows_without_totals_fall_back_to_sums(
    world_a: TenantWorld, monkeypatch: Any
) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    rng, now = random.Random(11), timezone.now()
    # The canary: v2 until 2 hours ago, another version for an hour, then v2 again (a new
    # episode: its totals restart from 0).
    rows = _episode(deployment, "canary", "m:v2", range(300, 120, -1), now, rng)
    rows += _episode(deployment, "canary", "m:v3", range(120, 60, -1), now, rng)
    rows += _episode(deployment, "canary", "m:v2", range(60, 0, -1), now, rng)
    rows += _episode(deployment, "stable", "m:v1", range(300, 0, -1), now, rng)
    insert_samples(rows)
    # A stable row stored without histograms and without totals: counts as zeros there.
    row = SliSample.objects.filter(deployment=deployment, group="stable").order_by("end")[150]
    SliSample.objects.filter(pk=row.pk).update(latency=[], cumulative={})
    calls = _spy(monkeypatch)
    both: list[dict[str, str | None]] = [
        {"stable": "m:v1", "canary": "m:v2"},
        {"stable": "m:v1", "canary": None},  # every canary row counts, labels named
    ]
    for versions in both:
        for seconds in (1800, 3 * 3600, 86400):
            plain, summed = _both(deployment, seconds, versions)
            assert summed == plain
    assert calls  # the restart and the row without histograms were summed in SQL
    plain, summed = _both(deployment, 86400, {"stable": "m:v1", "canary": "m:v2"})
    assert summed["canary"].other_versions == {"m:v3"}


def _plain_totals(deployment: Deployment, since: datetime, now: datetime) -> tuple[int, int]:
    rows = SliSample.objects.filter(
        deployment=deployment, resolution=Resolution.MINUTE, end__gt=since, end__lte=now
    )
    return sum(r.requests for r in rows), sum(r.errors for r in rows)


def test_request_totals_are_the_row_sums_with_and_without_a_restart(
    world_a: TenantWorld,
) -> None:
    """incidents' availability reads window_request_totals: the SUM of every minute row."""
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    rng, now = random.Random(5), timezone.now()
    rows = _episode(deployment, "stable", "m:v1", range(400, 0, -1), now, rng)
    insert_samples(rows)
    # A history that started before the window: the oldest row's totals are not its own.
    SliSample.objects.filter(deployment=deployment, end__lt=now - timedelta(minutes=300)).delete()
    for minutes in (30, 120, 600):
        since = now - timedelta(minutes=minutes)
        found = selectors.window_request_totals(tenant=world_a.tenant, since=since, now=now)
        assert found[deployment.pk] == _plain_totals(deployment, since, now)
    # The canary: one episode, another version, then the first version again from 0.
    rows = _episode(deployment, "canary", "m:v2", range(200, 100, -1), now, rng)
    rows += _episode(deployment, "canary", "m:v3", range(100, 50, -1), now, rng)
    rows += _episode(deployment, "canary", "m:v2", range(50, 0, -1), now, rng)
    insert_samples(rows)
    for minutes in (30, 80, 150, 600):
        since = now - timedelta(minutes=minutes)
        found = selectors.window_request_totals(tenant=world_a.tenant, since=since, now=now)
        assert found[deployment.pk] == _plain_totals(deployment, since, now)
    # Rows without totals (written by hand, as the older tests do) are summed as they are.
    SliSample.objects.filter(deployment=deployment, group="stable").update(cumulative={})
    since = now - timedelta(minutes=600)
    found = selectors.window_request_totals(tenant=world_a.tenant, since=since, now=now)
    assert found[deployment.pk] == _plain_totals(deployment, since, now)


def test_health_series_buckets_in_sql_are_the_row_by_row_buckets(
    world_a: TenantWorld, monkeypatch: Any
) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: now)  # one cut-off for both ways
    rng = random.Random(3)
    rows = _episode(deployment, "stable", "m:v1", range(2000, 0, -1), now, rng)
    rows += _episode(deployment, "canary", "m:v2", range(700, 0, -1), now, rng)
    insert_samples(rows)
    # Rows stored without a histogram: the buckets' p95 comes from the others (or none).
    stable = SliSample.objects.filter(deployment=deployment, group="stable").order_by("end")
    SliSample.objects.filter(pk__in=[r.pk for r in stable[100:130]]).update(latency=[])
    week = {"resolution": Resolution.MINUTE, "since": now - timedelta(days=7), "bucket": 840}
    ids = {"tenant_id": world_a.tenant.pk, "deployment_id": deployment.pk}
    assert bucket_sums(**ids, **week) is not None  # summed in SQL
    for range_name in ("1h", "24h", "7d"):
        in_sql = sli_series(world_a.tenant, deployment, range_name)
        with monkeypatch.context() as patched:
            patched.setattr(health_views, "bucket_sums", lambda **kwargs: None)
            row_by_row = sli_series(world_a.tenant, deployment, range_name)
        assert in_sql == row_by_row and in_sql["x"]
    # A histogram neither empty nor full: added row by row, as before.
    SliSample.objects.filter(pk=stable[5].pk).update(latency=[1, 2])
    assert bucket_sums(**ids, **week) is None
