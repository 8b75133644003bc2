"""Platform staff see the serving rooms in the admin; only shared pools are editable there."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from serving.deployments.models import SharedPool
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    user = User.objects.create_superuser("sre@platform.example", "sre@platform.example", "pw")
    client = Client()
    client.force_login(user)
    return client


def pool_form(world: TenantWorld, *, allowed: list[int]) -> dict[str, object]:
    """The admin's add/change form of a small pool serving `world`'s version."""
    return {
        "name": "tiny",
        "model_version": world.version.pk,
        "num_replicas": 1,
        "num_cpus": 0.5,
        "num_gpus": 0,
        "kv_blocks": 256,
        "block_size": 16,
        "min_tenants": 4,
        "max_num_seqs": 32,
        "allowed_tenants": allowed,
        "is_active": "on",
        "created_at_0": "2026-12-02",
        "created_at_1": "12:00:00",
    }


@pytest.mark.parametrize(
    "name",
    [
        "model",
        "modelversion",
        "deployment",
        "deploymentrevision",
        "inferencekey",
        "reconcilerun",
        "sharedpool",
    ],
)
def test_changelists_render(world_a: TenantWorld, staff_client: Client, name: str) -> None:
    response = staff_client.get(f"/admin/serving/{name}/")
    assert response.status_code == 200


def test_key_hashes_never_show_and_deployments_are_read_only(
    world_a: TenantWorld, staff_client: Client
) -> None:
    from serving.deployments.models import Deployment, InferenceKey

    deployment = Deployment.objects.filter(tenant=world_a.tenant).first()
    assert deployment is not None
    key = InferenceKey.objects.get(deployment=deployment)
    page = staff_client.get(f"/admin/serving/inferencekey/{key.pk}/change/")
    assert page.status_code == 200 and key.key_hash not in page.content.decode()
    assert staff_client.get("/admin/serving/deployment/add/").status_code == 403


def test_staff_create_a_shared_pool(world_a: TenantWorld, staff_client: Client) -> None:
    response = staff_client.post(
        "/admin/serving/sharedpool/add/",
        pool_form(world_a, allowed=[world_a.tenant.pk]),
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    pool = SharedPool.objects.get(name="tiny")
    assert pool.kv_blocks == 256 and list(pool.allowed_tenants.all()) == [world_a.tenant]


def test_a_pool_change_is_audited_in_the_tenants_it_concerns(
    world_a: TenantWorld, world_b: TenantWorld, staff_client: Client
) -> None:
    """The admin saves pools through pool_save: a tenant granted the pool (or no longer
    granted it) sees the change in its audit log, without the other tenants' names; a tenant
    never granted it sees nothing."""
    from tenants.models import AuditEvent

    form = pool_form(world_a, allowed=[world_a.tenant.pk])
    assert staff_client.post("/admin/serving/sharedpool/add/", form).status_code == 302
    pool = SharedPool.objects.get(name="tiny")
    created = AuditEvent.objects.get(tenant=world_a.tenant, action="pool.create")
    assert created.after["granted"] is True and created.after["kv_blocks"] == 256
    assert not AuditEvent.objects.filter(tenant=world_b.tenant).filter(action__startswith="pool.")

    form.update(kv_blocks=512, allowed_tenants=[world_b.tenant.pk])
    url = f"/admin/serving/sharedpool/{pool.pk}/change/"
    assert staff_client.post(url, form).status_code == 302
    pool.refresh_from_db()
    assert pool.kv_blocks == 512 and list(pool.allowed_tenants.all()) == [world_b.tenant]
    revoked = AuditEvent.objects.get(tenant=world_a.tenant, action="pool.update")
    assert revoked.before["granted"] is True and revoked.after["granted"] is False
    granted = AuditEvent.objects.get(tenant=world_b.tenant, action="pool.update")
    assert granted.before["kv_blocks"] == 256 and granted.after["kv_blocks"] == 512
    assert granted.after["granted"] is True
    assert "allowed_tenants" not in granted.after


def test_only_platform_staff_save_pools(world_a: TenantWorld) -> None:
    from portal.exceptions import PermissionDeniedError
    from serving.deployments.services import pool_save
    from tenants.actors import Actor

    pool = SharedPool(name="mine", model_version=world_a.version)
    with pytest.raises(PermissionDeniedError):
        pool_save(pool=pool, actor=Actor(user=world_a.owner))
    assert not SharedPool.objects.filter(name="mine").exists()
