"""The shared pools page: a tenant sees the pools it is allowed on, its fair share there and
its deployments on each (never another tenant's); staff also see every pool to manage."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from serving.deployments import services
from serving.deployments.models import Deployment, SharedPool
from serving.registry import services as registry
from tenants.actors import Actor
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def test_a_tenant_sees_its_share_and_its_deployments_staff_see_every_pool(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    for world in (world_a, world_b):
        registry.version_validate(tenant=world.tenant, version_id=world.version.pk)
    served = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    pool = SharedPool.objects.create(name="tiny", kv_blocks=1024, min_tenants=4, num_replicas=2,
                                     model_version=served.current_revision.stable_version)  # fmt: skip
    closed = SharedPool.objects.create(name="closed", model_version=pool.model_version)
    pool.allowed_tenants.add(world_a.tenant, world_b.tenant)
    for world in (world_a, world_b):
        services.deployment_create(tenant=world.tenant, actor=Actor(user=world.owner),
                                   name=f"pooled-{world.tenant.slug}", version_id=world.version.pk,
                                   settings={"kv_mode": "shared", "pool": pool.name})  # fmt: skip
    url = reverse("serving-pools", args=[world_a.tenant.slug])
    client.force_login(world_a.viewer)
    page = client.get(url).content.decode()
    mine = page.split('data-testid="pool-mine"')[1].split("</section>")[0]
    # 1024 blocks / 4 tenants = 256 per replica (the plan allows more), x 2 replicas.
    assert 'data-pool="tiny"' in page and 'data-testid="pool-blocks">512<' in mine
    assert "pooled-acme" in mine and "pooled-globex" not in page
    assert "closed" not in page and 'data-testid="pool-every"' not in page
    world_a.viewer.is_staff = True
    world_a.viewer.save(update_fields=["is_staff"])
    staff = client.get(url).content.decode()
    every = staff.split('data-testid="pool-every"')[1].split("</section>")[0]
    assert (
        "tiny" in every
        and "closed" in every
        and reverse("platform-pool", args=[closed.pk]) in every
    )
    client.force_login(world_b.viewer)
    assert client.get(url).status_code == 404


def test_a_tenant_without_a_pool_is_told(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.viewer)
    page = client.get(reverse("serving-pools", args=[world_a.tenant.slug])).content.decode()
    assert 'data-testid="pool-none"' in page


def test_staff_create_and_change_a_pool_on_its_page_and_each_granted_tenant_sees_it(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    from tenants.models import AuditEvent

    registry.version_validate(tenant=world_a.tenant, version_id=world_a.version.pk)
    new = reverse("platform-pool-new")
    client.force_login(world_a.viewer)  # not staff
    assert client.get(new).status_code == 302 and not SharedPool.objects.exists()
    world_a.owner.is_staff = True
    world_a.owner.save(update_fields=["is_staff"])
    client.force_login(world_a.owner)
    page = client.get(new).content.decode()
    assert 'data-testid="pool-form"' in page and "acme / assistant · v1" in page
    data = {"name": "tiny", "model_version": world_a.version.pk, "num_replicas": 2,
            "num_cpus": 0.25, "num_gpus": 0, "kv_blocks": 1024, "block_size": 16,
            "min_tenants": 4, "max_num_seqs": 32, "is_active": "on", "engine_name": "builtin",
            "allowed_tenants": [world_a.tenant.pk, world_b.tenant.pk]}  # fmt: skip
    bad = client.post(new, {**data, "kv_blocks": 4}).content.decode()
    assert "errorlist" in bad and not SharedPool.objects.exists()
    bad_engine = client.post(new, {**data, "engine_name": "vllm"}).content.decode()
    assert "validated for builtin only" in bad_engine and not SharedPool.objects.exists()
    response = client.post(new, data)
    pool = SharedPool.objects.get(name="tiny")
    assert response.status_code == 302 and response["Location"] == reverse(
        "platform-pool", args=[pool.pk]
    )
    assert set(pool.allowed_tenants.all()) == {world_a.tenant, world_b.tenant}
    for world in (world_a, world_b):  # audited in every tenant it is granted to
        assert AuditEvent.objects.filter(tenant=world.tenant, action="pool.create").count() == 1
    edit = reverse("platform-pool", args=[pool.pk])
    changed = client.post(edit, {**data, "num_replicas": 3, "allowed_tenants": [world_a.tenant.pk]})
    assert changed.status_code == 302
    pool.refresh_from_db()
    assert pool.num_replicas == 3 and list(pool.allowed_tenants.all()) == [world_a.tenant]
    # The tenant taken off is told it may no longer use it, and sees it no more.
    revoked = AuditEvent.objects.get(tenant=world_b.tenant, action="pool.update")
    assert revoked.after["granted"] is False
    client.force_login(world_b.owner)
    mine = client.get(reverse("serving-pools", args=[world_b.tenant.slug])).content.decode()
    assert 'data-pool="tiny"' not in mine and 'data-testid="pool-none"' in mine
