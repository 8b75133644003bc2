"""Capacity is explained, on the real test cluster (2 CPUs, no GPU): the API and the page show
what is free; a create or change whose replicas cannot be placed is refused 409 naming the
setting (nothing written); on a cluster that autoscales it is admitted and its status gives
Ray's reason while it waits."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core.cache import cache
from django.test import override_settings

from serving.deployments import reconcile as control
from serving.deployments.capacity import CACHE_KEY
from serving.deployments.models import Deployment, DeploymentStatus
from tenants.models import AuditEvent, Quota
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


@pytest.fixture
def pointed(ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The portal's cluster is the test cluster, and admission asks it."""
    for name, value in ray_cluster.portal_env().items():
        monkeypatch.setenv(name, value)
    cache.delete(CACHE_KEY)
    with override_settings(CLUSTER_CAPACITY=True):
        yield monkeypatch
    cache.delete(CACHE_KEY)


def _version(world: TenantWorld) -> int:
    served = Deployment.objects.get(tenant=world.tenant, name="assistant")
    return int(served.current_revision.stable_version_id)


def test_admission_refuses_replicas_the_cluster_cannot_place_naming_the_setting(
    world_a: TenantWorld, pointed: Any
) -> None:
    Quota.objects.filter(tenant=world_a.tenant).update(max_replicas=50, max_deployments=10)
    api = world_a.client()
    shown = api.get("/api/v1/deployments/capacity/")
    assert shown.status_code == 200, shown.content
    body = shown.json()
    assert body["known"] is True and body["nodes"] == 1 and body["autoscales"] is False
    assert body["cpu"]["total"] == 2.0 and 0 <= body["cpu"]["free"] <= 2.0
    assert body["gpu"]["total"] == 0 and body["memory_bytes"]["total"] > 0
    assert "pending" not in body  # other deployments' demands are not a tenant's to see
    audits = AuditEvent.objects.filter(tenant=world_a.tenant).count()

    big = api.post(
        "/api/v1/deployments/",
        {"name": "big", "version": _version(world_a), "num_cpus": 3},
        format="json",
    )
    assert big.status_code == 409, big.content
    error = big.json()["error"]
    assert error["code"] == "insufficient_capacity"
    assert list(error["fields"]) == ["num_cpus"]
    assert "1 replica(s) x 3 CPU" in error["message"] and "no node has 3 CPU" in error["message"]
    many = api.post(
        "/api/v1/deployments/",
        {"name": "many", "version": _version(world_a), "num_cpus": 0.5, "num_replicas": 6},
        format="json",
    )
    assert many.status_code == 409 and list(many.json()["error"]["fields"]) == ["num_replicas"]
    assert not Deployment.objects.filter(tenant=world_a.tenant, name__in=["big", "many"]).exists()
    assert AuditEvent.objects.filter(tenant=world_a.tenant).count() == audits  # nothing written

    # A change: raising the ask is refused naming it; what fits, and lowering, go through.
    served = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    url = f"/api/v1/deployments/{served.pk}/"
    raised = api.patch(url, {"num_cpus": 4}, format="json")
    assert raised.status_code == 409 and list(raised.json()["error"]["fields"]) == ["num_cpus"]
    assert api.patch(url, {"num_cpus": 0.5}, format="json").status_code == 200
    assert api.patch(url, {"num_cpus": 0.25}, format="json").status_code == 200

    page = world_a.client("owner").get(f"/t/{world_a.tenant.slug}/deployments/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-testid="cluster-capacity" data-known="true"' in html
    assert "of 2 free" in html and "none in the cluster" in html  # CPU, and no GPU


def test_on_an_autoscaling_cluster_the_deployment_waits_and_says_why(
    world_a: TenantWorld, ray_cluster: RayCluster, pointed: Any
) -> None:
    pointed.setenv("RAY_CLUSTER_AUTOSCALES", "1")
    api = world_a.client()
    shown = api.get("/api/v1/deployments/capacity/").json()
    assert shown["autoscales"] is True
    served = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    changed = api.patch(f"/api/v1/deployments/{served.pk}/", {"num_cpus": 3}, format="json")
    assert changed.status_code == 200, changed.content  # admitted: a node may come
    client = ray_cluster.client()
    control.reconcile(target=ray_cluster.target, client=client)
    deadline = time.monotonic() + 60
    served.refresh_from_db()
    while "Ray cannot place" not in served.status_message and time.monotonic() < deadline:
        time.sleep(1)
        cache.delete(CACHE_KEY)
        control.refresh_status(client=client)
        served.refresh_from_db()
    assert served.status == DeploymentStatus.DEPLOYING
    assert "Ray cannot place 1 replica(s) asking for 3 CPU each" in served.status_message
    assert "of 2 CPU free; waiting for the autoscaler" in served.status_message
    detail = api.get(f"/api/v1/deployments/{served.pk}/").json()
    assert "Ray cannot place" in detail["status_message"]
