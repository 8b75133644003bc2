"""The request inspector: the selector over what two router replicas published to Redis (merged,
newest first, the slowest, a search by trace or request id, a bad `q`, another tenant's
deployment), and its page (rows, the accessible lifecycle bar, the live part, the search)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse

from portal.exceptions import NotFoundError, ValidationFailed
from serving.dataplane.answers import publish_router
from serving.dataplane.lifecycle import Lifecycle, RecentRequests
from serving.deployments.models import Deployment
from serving.telemetry.inspector import request_list, request_query
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

TRACE_A = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACE_B = "0af7651916cd43dd8448eb211c80319c"


def _deployment(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant")


def _life(
    recent: RecentRequests,
    request_id: str,
    *,
    started: float,
    total_s: float,
    trace: str | None = None,
    failed: tuple[int, str] | None = None,
    hits: int | None = 16,
) -> Lifecycle:
    """A finished lifecycle that started at `started` and took `total_s` (a tenth of it
    validating, a tenth routing, the rest executing), or failed while validating."""
    life = Lifecycle(request_id, trace_id=trace)
    recent.add(life)
    life.times["pending"] = started
    life.to("validating")
    life.times["validating"] = started
    if failed is not None:
        life.to(
            "failed", error="missing or unknown inference key", status=failed[0], code=failed[1]
        )
        life.times["failed"] = started + total_s
        return life
    life.group = "stable"
    for state, at in (("routing", 0.1), ("executing", 0.2), ("completed", 1.0)):
        life.to(state)
        life.times[state] = started + at * total_s
    event = {"version": "v3", "replica": "rep-1", "pid": 77, "prefix_hit_tokens": hits}
    life.answered({**event, "usage": {"prompt_tokens": 40, "completion_tokens": 4}})
    return life


def _publish(deployment: Deployment, replica: str, recent: RecentRequests) -> None:
    snapshot = {
        "app": deployment.serve_app,
        "replica": replica,
        "pid": 1000,
        "at": time.time(),
        "breakers": {},
        "requests": recent.snapshot(),
    }

    async def send() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        await publish_router(client, settings.SLI_KEY_PREFIX, snapshot)
        await client.aclose()

    asyncio.run(send())


def _two_replicas(deployment: Deployment) -> None:
    now = time.time()
    one, two = RecentRequests(), RecentRequests()
    _life(one, "r1-old", started=now - 60, total_s=4.0, trace=TRACE_A)
    _life(one, "r1-new", started=now - 5, total_s=0.02)
    _life(one, "r1-refused", started=now - 3, total_s=0.001, failed=(401, "invalid_api_key"))
    _life(two, "r2-mid", started=now - 30, total_s=1.0, trace=TRACE_A)
    _life(two, "r2-newest", started=now - 1, total_s=0.05, trace=TRACE_B, hits=None)
    _publish(deployment, "router-1", one)
    _publish(deployment, "router-2", two)


def test_the_selector_merges_the_router_replicas(world_a: TenantWorld) -> None:
    deployment = _deployment(world_a)
    _two_replicas(deployment)
    view = request_list(tenant=world_a.tenant, deployment=deployment)
    assert view["available"] and view["reporting"] == 2 and view["found"] is None
    assert [r["request_id"] for r in view["recent"]] == [
        "r2-newest", "r1-refused", "r1-new", "r2-mid", "r1-old",
    ]  # fmt: skip
    assert [r["request_id"] for r in view["slow"]][:2] == ["r1-old", "r2-mid"]
    by_id = {r["request_id"]: r for r in view["recent"]}
    old = by_id["r1-old"]
    assert old["router"] == "router-1" and old["trace_id"] == TRACE_A
    assert (old["version"], old["replica"], old["pid"], old["status"]) == ("v3", "rep-1", 77, 200)
    assert (old["prompt_tokens"], old["completion_tokens"], old["prefix_hit_tokens"]) == (40, 4, 16)
    assert old["total_ms"] == pytest.approx(4000, abs=1)
    assert [(p["state"], p["pct"]) for p in old["phases"]] == [
        ("validating", 10.0), ("routing", 10.0), ("executing", 80.0),
    ]  # fmt: skip
    assert old["phases"][2]["ms"] == pytest.approx(3200, abs=1)
    refused = by_id["r1-refused"]
    assert (refused["status"], refused["code"], refused["answered"]) == (
        401,
        "invalid_api_key",
        False,
    )
    assert by_id["r2-newest"]["prefix_hit_tokens"] is None


def test_search_by_trace_or_request_id_and_a_bad_q(world_a: TenantWorld) -> None:
    deployment = _deployment(world_a)
    _two_replicas(deployment)
    found = request_list(tenant=world_a.tenant, deployment=deployment, query=TRACE_A.upper())
    assert found["query"] == ("trace", TRACE_A)
    assert [r["request_id"] for r in found["found"]] == ["r2-mid", "r1-old"]
    one = request_list(tenant=world_a.tenant, deployment=deployment, query=" r1-new ")
    assert [r["request_id"] for r in one["found"]] == ["r1-new"]
    none = request_list(tenant=world_a.tenant, deployment=deployment, query="r1")  # exact only
    assert none["found"] == []
    assert request_query("") is None
    for bad in ("has space", "x" * 129, "tab\there", "ünïcode", "a\nb"):
        with pytest.raises(ValidationFailed) as refused:
            request_list(tenant=world_a.tenant, deployment=deployment, query=bad)
        assert refused.value.field == "q" and "trace id" in refused.value.message


def test_another_tenants_deployment_is_never_read(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    mine, theirs = _deployment(world_a), _deployment(world_b)
    _two_replicas(theirs)
    with pytest.raises(NotFoundError):
        request_list(tenant=world_a.tenant, deployment=theirs)
    # The app is the deployment's own: a's view is empty although b's routers published.
    view = request_list(tenant=world_a.tenant, deployment=mine, query=TRACE_A)
    assert view["recent"] == [] and view["found"] == [] and view["reporting"] == 0
    client.force_login(world_a.owner)
    url = reverse(
        "serving-deployment-requests", kwargs={"slug": world_a.tenant.slug, "pk": theirs.pk}
    )
    assert client.get(url).status_code == 404
    foreign_slug = reverse(
        "serving-deployment-requests", kwargs={"slug": world_b.tenant.slug, "pk": theirs.pk}
    )
    assert client.get(foreign_slug).status_code == 404


def test_the_page_lists_searches_and_polls(
    client: Any, world_a: TenantWorld, settings: Any
) -> None:
    deployment = _deployment(world_a)
    url = reverse(
        "serving-deployment-requests", kwargs={"slug": world_a.tenant.slug, "pk": deployment.pk}
    )
    assert client.get(url).status_code == 302  # to the login page
    client.force_login(world_a.viewer)
    empty = client.get(url).content.decode()
    assert "No router replica is reporting" in empty

    _two_replicas(deployment)
    page = client.get(url).content.decode()
    assert 'data-testid="requests-search"' in page and 'name="q"' in page
    assert 'hx-trigger="every 5s"' in page and "css/requests.css" in page
    assert page.count('data-testid="request-row"') == 5 + 5  # recent, and the slowest
    assert 'aria-label="validating 400.00 ms, routing 400.00 ms, executing 3200.00 ms"' in page
    assert "width: 80.0%" in page and ">V</abbr> 400.0" in page
    assert "not reported by this engine" in page  # r2-newest: no prefix-hit count
    assert "401 invalid_api_key" in page and "not answered" in page

    live = client.get(url, {"live": "1", "q": TRACE_A}).content.decode()
    assert live.startswith('<div id="requests-live"') and "requests-search" not in live
    assert f"q={TRACE_A}" in live  # the poll keeps the search
    assert 'data-testid="requests-found"' in live
    found = live.split('data-testid="requests-recent"')[0]
    assert found.count('data-testid="request-row"') == 2

    missing = client.get(url, {"q": "req-nothing-like-it"}).content.decode()
    assert 'data-testid="requests-not-found"' in missing

    bad = client.get(url, {"q": "<script>x y</script>"})
    assert bad.status_code == 400
    text = bad.content.decode()
    assert 'data-testid="requests-q-error"' in text and "q must be a trace id" in text
    assert "<script>x y" not in text and 'aria-invalid="true"' in text

    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert 'data-testid="requests-unavailable"' in client.get(url).content.decode()
