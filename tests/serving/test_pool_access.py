"""Shared pools, portal side: joining needs the platform's grant, every pool tenant gets its
fair share, a tenant removed from a pool (or suspended) is not served, and a shared deployment
shows its share and use."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from portal.exceptions import ValidationFailed
from serving.control.compile import compile_config
from serving.deployments import services
from serving.deployments.keys import cache_salt_hex
from serving.deployments.models import Deployment, SharedPool
from serving.deployments.specs import desired_state
from serving.registry import services as registry
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

POOL_KEY = "sli:platform.tiny.pool:pool"


@pytest.fixture(autouse=True)
def _ready_world_versions(request: pytest.FixtureRequest) -> None:
    """Validation runs on commit; these tests run inside one transaction, so run it here."""
    for name in ("world_a", "world_b"):
        if name in request.fixturenames:
            world = request.getfixturevalue(name)
            registry.version_validate(tenant=world.tenant, version_id=world.version.pk)
            world.version.refresh_from_db()


@pytest.fixture
def pool(world_a: TenantWorld) -> SharedPool:
    served = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    version = served.current_revision.stable_version  # type: ignore[union-attr]
    return SharedPool.objects.create(
        name="tiny", model_version=version, kv_blocks=1024, min_tenants=4, max_num_seqs=32
    )


def _join(world: TenantWorld, pool: SharedPool, name: str = "pooled") -> Deployment:
    deployment, _ = services.deployment_create(
        tenant=world.tenant, actor=Actor(user=world.owner), name=name,
        version_id=world.version.pk, settings={"kv_mode": "shared", "pool": pool.name},
    )  # fmt: skip
    return deployment


def _pool_config(config: dict[str, Any]) -> dict[str, Any]:
    app = next(a for a in config["applications"] if a["name"] == "platform.tiny.pool")
    return dict(app["deployments"][0]["user_config"])


def _router_config(config: dict[str, Any], name: str) -> dict[str, Any]:
    app = next(a for a in config["applications"] if a["name"] == name)
    return dict(app["deployments"][0]["user_config"])


def _compiled() -> dict[str, Any]:
    specs, pools, _ = desired_state()
    return compile_config(specs, pools=pools)


def test_joining_a_pool_needs_the_platforms_grant(world_a: TenantWorld, pool: SharedPool) -> None:
    client = world_a.client("token")
    body = {"name": "pooled", "version": world_a.version.pk, "kv_mode": "shared", "pool": "tiny"}
    response = client.post(reverse("deployment-list"), body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert list(error["fields"]) == ["pool"]
    assert "not allowed on pool tiny" in json.dumps(error)
    assert not Deployment.objects.filter(tenant=world_a.tenant, name="pooled").exists()
    pool.allowed_tenants.add(world_a.tenant)
    response = client.post(reverse("deployment-list"), body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["revision"]["pool"] == "tiny"


def test_every_pool_tenant_gets_its_fair_share(
    world_a: TenantWorld, world_b: TenantWorld, pool: SharedPool
) -> None:
    pool.allowed_tenants.add(world_a.tenant, world_b.tenant)
    Quota.objects.filter(tenant=world_a.tenant).update(max_kv_blocks=1_000_000)
    # B's plan is below the fair share (its dedicated deployment, 256 blocks, goes first).
    Deployment.objects.filter(tenant=world_b.tenant).update(deleted_at=timezone.now())
    Quota.objects.filter(tenant=world_b.tenant).update(max_kv_blocks=100)
    _join(world_a, pool)
    _join(world_b, pool)
    config = _compiled()
    tenants = _pool_config(config)["tenants"]
    a, b = str(world_a.tenant.pk), str(world_b.tenant.pk)
    # A's plan gives a million blocks; the pool has 1024 for at least 4 tenants: 256.
    assert tenants[a] == {"salt": cache_salt_hex(world_a.tenant.pk), "quota_blocks": 256,
                          "max_running": 8}  # fmt: skip
    assert tenants[b]["quota_blocks"] == 100 and tenants[b]["max_running"] == 8
    pool_app = next(a for a in config["applications"] if a["name"] == "platform.tiny.pool")
    assert pool_app["args"]["engine"]["max_num_seqs"] == 32
    assert pool_app["deployments"][0]["max_ongoing_requests"] == 64
    router = _router_config(config, "acme.pooled")
    assert router["pool_slots"] == 16  # 64 request slots of the pool over 4 tenants
    assert router["pool_access_revoked"] is False and router["suspended"] == ""


def test_a_tenant_the_platform_removes_from_a_pool_is_no_longer_served(
    world_a: TenantWorld, world_b: TenantWorld, pool: SharedPool
) -> None:
    pool.allowed_tenants.add(world_a.tenant, world_b.tenant)
    deployment = _join(world_a, pool)
    _join(world_b, pool)
    pool.allowed_tenants.remove(world_a.tenant)
    config = _compiled()
    assert set(_pool_config(config)["tenants"]) == {str(world_b.tenant.pk)}
    # Its router still compiles (a refused unit would keep its last good, serving config)
    # and answers 403 pool_access_revoked.
    assert _router_config(config, "acme.pooled")["pool_access_revoked"] is True
    assert _router_config(config, "globex.pooled")["pool_access_revoked"] is False
    # Staying on a pool is no new join: the tenant can still manage its deployment.
    services.inference_key_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        name="rotated",
    )  # fmt: skip
    # ...but cannot join it again elsewhere.
    with pytest.raises(ValidationFailed) as refused:
        _join(world_a, pool, name="again")
    assert refused.value.field == "pool"
    # Once the last tenant leaves, the pool's application stays (with no tenant) while a
    # deployment still points at it: its router must compile.
    pool.allowed_tenants.clear()
    config = _compiled()
    assert _pool_config(config)["tenants"] == {}
    assert _router_config(config, "globex.pooled")["pool_access_revoked"] is True


def test_a_suspended_tenants_routers_refuse_and_its_pool_place_is_dropped(
    world_a: TenantWorld, world_b: TenantWorld, pool: SharedPool
) -> None:
    pool.allowed_tenants.add(world_a.tenant, world_b.tenant)
    _join(world_a, pool)
    _join(world_b, pool)
    world_a.tenant.is_active = False
    world_a.tenant.save(update_fields=["is_active"])
    config = _compiled()
    for app in ("acme.pooled", "acme.assistant"):  # shared and dedicated alike
        assert _router_config(config, app)["suspended"] == "the platform suspended it"
    assert _router_config(config, "globex.assistant")["suspended"] == ""
    assert set(_pool_config(config)["tenants"]) == {str(world_b.tenant.pk)}


def _publish(replicas: list[dict[str, Any]]) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.SLI_KEY_PREFIX}:{POOL_KEY}"
    for index, tenants in enumerate(replicas):
        client.hset(key, f"replica-{index}", json.dumps({"kv": {"tenants": tenants}}))


def test_a_shared_deployment_shows_its_share_and_use_and_nothing_of_its_neighbours(
    world_a: TenantWorld, world_b: TenantWorld, pool: SharedPool
) -> None:
    pool.allowed_tenants.add(world_a.tenant, world_b.tenant)
    pool.num_replicas = 2
    pool.save(update_fields=["num_replicas"])
    Quota.objects.filter(tenant=world_a.tenant).update(max_kv_blocks=1_000_000)
    deployment = _join(world_a, pool)
    a, b = str(world_a.tenant.pk), str(world_b.tenant.pk)
    client = world_a.client("token")
    url = reverse("deployment-detail", args=[deployment.pk])
    share = client.get(url).json()["pool_share"]
    assert share == {"pool": "tiny", "allowed": True, "tenants_min": 4, "replicas": 2,
                     "quota_blocks": 512, "max_running": 16, "blocks_used": 0, "running": 0,
                     "waiting": 0, "replicas_reporting": 0}  # fmt: skip
    neighbour = {"blocks_used": 987_654, "running": 313_131, "waiting": 424_242}
    _publish([
        {a: {"blocks_used": 40, "running": 3, "waiting": 5}, b: neighbour},
        {a: {"blocks_used": 2, "running": 1, "waiting": 0}, b: neighbour},
    ])  # fmt: skip
    response = client.get(url)
    share = response.json()["pool_share"]
    assert (share["blocks_used"], share["running"], share["waiting"]) == (42, 4, 5)
    assert share["replicas_reporting"] == 2
    for theirs in (b"987654", b"313131", b"424242"):
        assert theirs not in response.content
    # A dedicated deployment has no pool share; the revoked tenant sees it is revoked.
    dedicated = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    detail = client.get(reverse("deployment-detail", args=[dedicated.pk])).json()
    assert detail["pool_share"] is None
    pool.allowed_tenants.remove(world_a.tenant)
    share = client.get(url).json()["pool_share"]
    assert share["allowed"] is False and share["quota_blocks"] == 0
    # Another tenant's deployment stays a 404.
    assert world_b.client("token").get(url).status_code == 404


def test_the_pool_share_card_shows_share_and_use() -> None:
    share = {"pool": "tiny", "allowed": True, "tenants_min": 4, "replicas": 1,
             "quota_blocks": 256, "max_running": 8, "blocks_used": 40, "running": 3,
             "waiting": 5, "replicas_reporting": 1}  # fmt: skip
    html = render_to_string("serving/_pool_share.html", {"share": share})
    assert "40 of 256" in html
    assert "3 running · 5 waiting · at most 8 at once" in html
    quiet = render_to_string("serving/_pool_share.html",
                             {"share": {**share, "blocks_used": None, "running": None}})  # fmt: skip
    assert "no replica reporting" in quiet
    revoked = render_to_string("serving/_pool_share.html", {"share": {**share, "allowed": False}})
    assert "pool_access_revoked" in revoked and "256" not in revoked


@pytest.mark.ray
def test_through_serve_request_ids_suspension_and_revocation(
    world_a: TenantWorld, world_b: TenantWorld, pool: SharedPool, ray_cluster: Any
) -> None:
    """On a real local Ray cluster: two tenants of one pool send the same x-request-id at once
    and both are answered; a suspended tenant's router answers 403 tenant_suspended, a tenant
    removed from the pool 403 pool_access_revoked, while the other keeps being served."""
    import threading
    import time

    import httpx

    from serving.deployments import reconcile as control

    pool.num_cpus, pool.kv_blocks = 0.25, 256
    pool.save(update_fields=["num_cpus", "kv_blocks"])
    pool.allowed_tenants.add(world_a.tenant, world_b.tenant)
    keys = {}
    for world in (world_a, world_b):
        Deployment.objects.filter(tenant=world.tenant).update(deleted_at=timezone.now())
        _, keys[world.tenant.slug] = services.deployment_create(
            tenant=world.tenant, actor=Actor(user=world.owner), name="pooled",
            version_id=world.version.pk, settings={"kv_mode": "shared", "pool": pool.name},
        )  # fmt: skip
    apps = ["platform.tiny.pool", "acme.pooled", "globex.pooled"]

    def apply() -> None:
        client = ray_cluster.client()
        before = max((a.last_deployed_time_s for a in client.applications().values()), default=0)
        control.reconcile(target=ray_cluster.target, client=client)
        client.wait_until(apps, deployed_after=before - 0.001, timeout=120)

    def post(http: httpx.Client, slug: str, **headers: str) -> httpx.Response:
        body = {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0}
        return http.post(f"{ray_cluster.serve_url}/{slug}/pooled/v1/completions", json=body,
                         headers={"authorization": f"Bearer {keys[slug]}", **headers})  # fmt: skip

    def until(slug: str, status: int, http: httpx.Client) -> httpx.Response:
        deadline = time.monotonic() + 30
        while True:
            response = post(http, slug)
            if response.status_code == status or time.monotonic() > deadline:
                return response
            time.sleep(0.3)

    apply()
    with httpx.Client(timeout=60, trust_env=False) as http:
        results: dict[str, httpx.Response] = {}

        def send(slug: str) -> None:
            results[slug] = post(http, slug, **{"x-request-id": "the-same-id"})

        threads = [threading.Thread(target=send, args=(s,)) for s in ("acme", "globex")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for slug in ("acme", "globex"):
            assert results[slug].status_code == 200, results[slug].text
            assert results[slug].json()["usage"]["completion_tokens"] == 24
        world_a.tenant.is_active = False
        world_a.tenant.save(update_fields=["is_active"])
        apply()
        refused = until("acme", 403, http)
        assert refused.json()["error"]["code"] == "tenant_suspended", refused.text
        assert post(http, "globex").status_code == 200
        pool.allowed_tenants.remove(world_b.tenant)
        apply()
        refused = until("globex", 403, http)
        assert refused.json()["error"]["code"] == "pool_access_revoked", refused.text
