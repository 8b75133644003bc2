"""The tenant's home page: every deployment at a glance (SLO state, budget, burn, firing,
traffic, errors, p95, canary, KV, incidents, rollbacks) from the real health tick's records, a
live fragment, a fixed number of queries whatever the number of deployments, and nothing of
another tenant."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from incidents.models import Incident, IncidentStatus, Severity
from portal.templatetags.units import duration_ms, per_second, percent
from serving.deployments import services as deploy
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health
from serving.ops.contracts import contract_set
from serving.ops.models import Rollback, SliSample
from serving.ops.selectors import recent_counts
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld
from tests.serving.test_ops_pages import CONTRACT, publish_sli

pytestmark = pytest.mark.django_db


def _running(world: TenantWorld, name: str = "assistant") -> Deployment:
    deployment = Deployment.objects.get(tenant=world.tenant, name=name)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    deployment.refresh_from_db()
    return deployment


def _row(page: str, name: str) -> str:
    return page.split(f'data-deployment="{name}"')[1].split("</tr>")[0]


def test_the_home_page_shows_each_deployments_slo_traffic_and_incidents(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = _running(world_a)
    contract_set(tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
                 source=CONTRACT)  # fmt: skip
    # Two real ticks over what a replica published: the window holds both.
    publish_sli(deployment, "stable", ok=90, failed=10)
    health.tick(now=time.time(), act=False)
    publish_sli(deployment, "stable", ok=180, failed=20)
    health.tick(now=time.time(), act=False)
    Incident.objects.create(tenant=world_a.tenant, deployment=deployment, title="errors up",
                            severity=Severity.PAGE, status=IncidentStatus.TRIGGERED,
                            dedup_key="k1")  # fmt: skip
    _running(world_b)  # a neighbour with its own deployment of the same name
    client.force_login(world_a.viewer)
    page = client.get(reverse("tenant-overview", args=[world_a.tenant.slug])).content.decode()
    row = _row(page, "assistant")
    assert 'data-slo="breach"' in row  # availability 90% against 99%
    assert "budget exhausted" in row and "burn 10.00×" in row  # 10% bad against 1% allowed
    assert 'data-testid="glance-firing"' in row and "firing" in row
    assert "10% errors" in row  # 20 of 200 in the window
    assert "1 open" in row and "errors up" in page
    assert "25 ms" in row  # the p95 bucket (its upper bound) of 20 ms answers
    assert page.count('data-testid="glance-row"') == 1  # world_b's is not here
    assert 'data-testid="tile-incidents">1<' in page
    assert "KV-cache blocks" in page and "16 / 64 blocks" in row
    live = client.get(reverse("tenant-overview-live", args=[world_a.tenant.slug]))
    assert live.status_code == 200 and live.content.decode().startswith('<div id="glance"')
    assert 'data-live-url="' in page and 'hx-trigger="every 5s"' in page
    # The other tenant's viewer sees nothing of acme's, and no row of acme's.
    client.force_login(world_b.viewer)
    assert client.get(reverse("tenant-overview", args=[world_a.tenant.slug])).status_code == 404
    other = client.get(reverse("tenant-overview", args=[world_b.tenant.slug])).content.decode()
    assert "errors up" not in other and 'data-slo="breach"' not in other


def test_the_window_counts_the_newest_minus_the_oldest_row(world_a: TenantWorld) -> None:
    """Two queries (the newest and the oldest row of each slot) give what summing every row
    in the window gives."""
    deployment = _running(world_a)
    total = 0
    for ok in (10, 30, 60):  # one replica's counters: 10, 30 then 60 requests in all
        publish_sli(deployment, "stable", ok=ok, failed=ok // 10)
        health.tick(now=time.time(), act=False)
        time.sleep(1.1)  # the next tick closes a row of its own
    rows = list(SliSample.objects.filter(deployment=deployment, group="stable", resolution=1))
    assert len(rows) >= 2, rows
    total = sum(r.requests for r in rows)
    counts = recent_counts(tenant=world_a.tenant, seconds=300)[(deployment.pk, "stable")]
    assert (counts.requests, counts.errors) == (total, sum(r.errors for r in rows)) == (66, 6)
    assert sum(counts.latency) == total
    span = (max(r.end for r in rows) - min(r.start for r in rows)).total_seconds()
    assert counts.seconds == pytest.approx(span)


def test_the_home_page_renders_in_a_fixed_number_of_queries(
    client: Any, world_a: TenantWorld
) -> None:
    actor = Actor(user=world_a.owner)
    version_id = Deployment.objects.get(tenant=world_a.tenant).current_revision.stable_version_id
    client.force_login(world_a.viewer)
    url = reverse("tenant-overview", args=[world_a.tenant.slug])
    live = reverse("tenant-overview-live", args=[world_a.tenant.slug])
    Quota.objects.filter(tenant=world_a.tenant).update(max_deployments=100, max_replicas=100)
    counted = []
    for total in (2, 8):
        while Deployment.objects.filter(tenant=world_a.tenant).count() < total:
            n = Deployment.objects.filter(tenant=world_a.tenant).count()
            made, _ = deploy.deployment_create(tenant=world_a.tenant, actor=actor, name=f"d{n}",
                                               version_id=version_id, settings={"num_cpus": 0.25})  # fmt: skip
            revision = made.current_revision
            Rollback.objects.create(tenant=world_a.tenant, deployment=made, key=f"k{n}",
                                    trigger="manual", from_revision=revision, to_revision=revision,
                                    detected_at=timezone.now())  # fmt: skip
            Incident.objects.create(tenant=world_a.tenant, deployment=made, title=f"i{n}",
                                    severity=Severity.PAGE, dedup_key=f"i{n}")  # fmt: skip
        with CaptureQueriesContext(connection) as page:
            assert client.get(url).status_code == 200
        with CaptureQueriesContext(connection) as part:
            assert client.get(live).status_code == 200
        counted.append((len(page), len(part)))
    assert counted[0] == counted[1], counted


def test_numbers_read_as_people_expect() -> None:
    assert percent(0.1) == "10%" and percent(0) == "0%" and percent(None) == "–"
    assert percent(0.00001) == "<0.01%" and percent(0.12345) == "12.3%"
    assert duration_ms(50.0) == "50 ms" and duration_ms(1500) == "1.5 s"
    assert duration_ms(float("inf")) == "> max" and duration_ms(None) == "–"
    assert per_second(12.345) == "12.3/s" and per_second(None) == "–"


def test_rows_stored_without_histograms_count_as_zeros(client: Any, world_a: TenantWorld) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from tests.incidents.slis import sample

    deployment = _running(world_a)
    sample(deployment, timezone.now() - timedelta(seconds=5), requests=50, errors=5)  # ttft []
    counts = recent_counts(tenant=world_a.tenant, seconds=300)[(deployment.pk, "stable")]
    assert (counts.requests, counts.errors, sum(counts.ttft)) == (50, 5, 0)
    client.force_login(world_a.viewer)
    page = client.get(reverse("tenant-overview", args=[world_a.tenant.slug])).content.decode()
    assert "10% errors" in _row(page, "assistant")
