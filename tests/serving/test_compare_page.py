"""The version comparison page: stable and canary SLIs over one window from stored rows (the
same cut-off for both), canary − stable with a better / worse marker in words, one slot alone,
rows of another version named and not counted, a running rollout's analysis, a bad range,
roles and another tenant."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from serving.deployments import services as deploy
from serving.deployments.models import Deployment
from serving.ops import rollouts
from serving.ops.models import Resolution, SliSample
from serving.registry import services as registry
from serving.registry.models import ModelVersion
from tenants.actors import Actor
from tests.conftest import TenantWorld, world_checkpoint
from tests.incidents.slis import latency, sample

pytestmark = pytest.mark.django_db


def _deployment(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant")


def _url(world: TenantWorld, deployment: Deployment, **query: str) -> str:
    url = reverse(
        "serving-deployment-compare", kwargs={"slug": world.tenant.slug, "pk": deployment.pk}
    )
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def _canary_version(world: TenantWorld) -> ModelVersion:
    served = ModelVersion.objects.get(tenant=world.tenant, label="s1").model
    version = registry.version_register_path(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        model=served,
        label="s2",
        path=str(world_checkpoint()),
    )
    registry.version_validate(tenant=world.tenant, version_id=version.pk)
    return version


def _with_canary(world: TenantWorld) -> tuple[Deployment, ModelVersion]:
    deployment = _deployment(world)
    version = _canary_version(world)
    deploy.deployment_set_canary(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        deployment=deployment,
        version_id=version.pk,
        percent=20,
    )
    deployment.refresh_from_db()
    return deployment, version


def _row(html: str, metric: str) -> str:
    found = re.search(rf'<tr data-testid="compare-row" data-metric="{metric}".*?</tr>', html, re.S)
    assert found, metric
    return found.group(0)


def test_both_arms_over_the_same_window_with_differences_in_words(
    client: Any, world_a: TenantWorld
) -> None:
    deployment, _ = _with_canary(world_a)
    now = timezone.now()
    for seconds_ago in (60, 30):
        end = now - timedelta(seconds=seconds_ago)
        sample(deployment, end, group="stable", requests=100, errors=1, latency_ms=40)
        sample(deployment, end, group="canary", requests=50, errors=5, rejected=10, latency_ms=300)
    # Outside the 15-minute window: neither slot counts it.
    old = now - timedelta(minutes=20)
    sample(deployment, old, group="stable", requests=9999, errors=9999)
    sample(deployment, old, group="canary", requests=9999)
    client.force_login(world_a.viewer)  # reading needs no write role
    response = client.get(_url(world_a, deployment))
    assert response.status_code == 200
    html = response.content.decode()
    window = re.search(r'data-testid="compare-window" data-since="(\d+)" data-until="(\d+)"', html)
    assert window and int(window.group(2)) - int(window.group(1)) == 900
    arms = re.findall(r'data-testid="compare-arm" data-group="(\w+)".*?<code>([^<]+)</code>', html)
    assert arms == [("stable", "served:s1"), ("canary", "served:s2")]
    requests = _row(html, "requests")
    assert '<td class="num" data-group="stable">200</td>' in requests
    assert '<td class="num" data-group="canary">100</td>' in requests
    assert "−100" in requests and "data-state" not in requests  # traffic: neither better nor worse
    errors = _row(html, "error_ratio")
    # stable 2 / 200 served = 1.0%; canary 10 / 80 served = 12.5%
    assert "+11.50 pp" in errors and "▲ worse" in errors and 'data-state="worse"' in errors
    p95 = _row(html, "p95_ms")
    assert "≤ 50 ms" in p95 and "≤ 500 ms" in p95 and "+450 ms" in p95 and "worse" in p95
    assert 'data-metric="ttft_p50_ms"' not in html  # no time to first token stored
    assert 'data-testid="analysis-none"' in html
    assert 'data-series-url="' in html  # the chart reads the health series endpoint


def test_a_better_canary_and_time_to_first_token_when_stored(
    client: Any, world_a: TenantWorld
) -> None:
    deployment, _ = _with_canary(world_a)
    end = timezone.now() - timedelta(seconds=5)
    stable = sample(deployment, end, group="stable", requests=100, errors=10, latency_ms=900)
    canary = sample(deployment, end, group="canary", requests=100, errors=0, latency_ms=20)
    SliSample.objects.filter(pk=stable.pk).update(ttft=latency(400, 100))
    SliSample.objects.filter(pk=canary.pk).update(ttft=latency(90, 100))
    client.force_login(world_a.viewer)
    html = client.get(_url(world_a, deployment)).content.decode()
    assert "▼ better" in _row(html, "error_ratio") and "−10.00 pp" in _row(html, "error_ratio")
    assert "▼ better" in _row(html, "p99_ms")
    ttft = _row(html, "ttft_p95_ms")
    assert "≤ 500 ms" in ttft and "≤ 100 ms" in ttft and "better" in ttft


def test_canary_only_and_stable_only_data(client: Any, world_a: TenantWorld) -> None:
    deployment, _ = _with_canary(world_a)
    client.force_login(world_a.owner)
    empty = client.get(_url(world_a, deployment)).content.decode()
    assert 'data-testid="compare-empty"' in empty
    row = sample(deployment, timezone.now() - timedelta(seconds=10), group="canary", errors=3)
    html = client.get(_url(world_a, deployment)).content.decode()
    assert re.findall(r'data-testid="compare-arm" data-group="(\w+)"', html) == ["canary"]
    assert "Only the canary slot has data" in html and 'data-testid="difference"' not in html
    assert '<td class="num" data-group="canary">3%</td>' in _row(html, "error_ratio")
    SliSample.objects.filter(pk=row.pk).update(group="stable")
    html = client.get(_url(world_a, deployment)).content.decode()
    assert re.findall(r'data-testid="compare-arm" data-group="(\w+)"', html) == ["stable"]
    assert "Only the stable slot has data" in html


def test_rows_of_another_version_are_named_not_counted(client: Any, world_a: TenantWorld) -> None:
    deployment, _ = _with_canary(world_a)
    end = timezone.now() - timedelta(seconds=10)
    sample(deployment, end, group="canary", requests=40)
    previous = sample(deployment, end, group="canary", requests=500)
    SliSample.objects.filter(pk=previous.pk).update(version="served:s0")
    sample(deployment, end, group="stable", requests=60)
    client.force_login(world_a.owner)
    html = client.get(_url(world_a, deployment)).content.decode()
    assert '<td class="num" data-group="canary">40</td>' in _row(html, "requests")
    assert "not counted: rows of served:s0" in html


def test_longer_ranges_read_minute_rows(client: Any, world_a: TenantWorld) -> None:
    deployment, _ = _with_canary(world_a)
    end = timezone.now() - timedelta(minutes=30)
    for group in ("stable", "canary"):
        sample(deployment, end, group=group, seconds=60, requests=120, resolution=Resolution.MINUTE)
    client.force_login(world_a.owner)
    assert 'data-testid="compare-empty"' in client.get(_url(world_a, deployment)).content.decode()
    html = client.get(_url(world_a, deployment, range="1h")).content.decode()
    assert "per-minute" in html
    assert '<td class="num" data-group="stable">2/s</td>' in _row(html, "rate")


def test_a_running_rollout_shows_the_analysis_over_the_window(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    version = _canary_version(world_a)
    actor = Actor(user=world_a.owner)
    rollouts.policy_set(
        tenant=world_a.tenant,
        actor=actor,
        deployment=deployment,
        values={"steps": [{"weight": 20, "pause_s": 60}], "min_requests": 10},
    )
    rollouts.rollout_start(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=version.pk
    )
    end = timezone.now() - timedelta(seconds=10)
    sample(deployment, end, group="stable", requests=200, errors=0)
    sample(deployment, end, group="canary", requests=50, errors=20)
    client.force_login(world_a.owner)
    html = client.get(_url(world_a, deployment)).content.decode()
    verdict = re.search(r'data-testid="analysis-window" data-state="(\w+)"', html)
    assert verdict and verdict.group(1) == "failed"
    assert "canary error ratio 0.400" in html and "at least 10 canary requests" in html
    assert 'data-testid="analysis-last"' in html and "none yet" in html


def test_a_bad_range_names_the_field(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.owner)
    response = client.get(_url(world_a, _deployment(world_a), range="2y"))
    assert response.status_code == 400
    assert "range must be one of 15m, 1h, 24h, 7d." in response.content.decode()


def test_another_tenants_deployment_is_not_found(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    client.force_login(world_a.owner)
    foreign = _url(world_a, _deployment(world_b))
    assert client.get(foreign).status_code == 404
    client.logout()
    assert client.get(_url(world_a, _deployment(world_a))).status_code == 302  # to sign in
