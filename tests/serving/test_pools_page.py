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
        and f"/admin/serving/sharedpool/{closed.pk}/change/" in every
    )
    client.force_login(world_b.viewer)
    assert client.get(url).status_code == 404


def test_a_tenant_without_a_pool_is_told(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.viewer)
    page = client.get(reverse("serving-pools", args=[world_a.tenant.slug])).content.decode()
    assert 'data-testid="pool-none"' in page
