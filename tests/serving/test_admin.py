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
    version = world_a.version
    response = staff_client.post(
        "/admin/serving/sharedpool/add/",
        {
            "name": "tiny",
            "model_version": version.pk,
            "num_replicas": 1,
            "num_cpus": 0.5,
            "num_gpus": 0,
            "kv_blocks": 256,
            "block_size": 16,
            "min_tenants": 4,
            "max_num_seqs": 32,
            "allowed_tenants": [world_a.tenant.pk],
            "is_active": "on",
            "created_at_0": "2026-12-02",
            "created_at_1": "12:00:00",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    pool = SharedPool.objects.get(name="tiny")
    assert pool.kv_blocks == 256 and list(pool.allowed_tenants.all()) == [world_a.tenant]
