"""The platform view for staff: deployments of every tenant by state, the GPU agents (their
provider, simulated or not, stale or alive), the deployments drifting from Serve, the recent
reconcile runs, and the nodes (or that Ray cannot say)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import Client

from serving.deployments.models import Deployment, DeploymentStatus, ReconcileRun
from serving.telemetry.keys import gpu_keys
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _section(page: str, testid: str) -> str:
    return page.split(f'data-testid="{testid}"')[1].split("</section>")[0]


def test_staff_see_the_fleet(client: Client, world_a: TenantWorld, world_b: TenantWorld) -> None:
    Deployment.objects.filter(tenant=world_a.tenant).update(status=DeploymentStatus.RUNNING)
    ReconcileRun.objects.create(ok=False, applications=3, error="Serve refused acme.assistant")
    r = redis.Redis.from_url(settings.REDIS_URL)
    drifting = Deployment.objects.get(tenant=world_b.tenant)
    drift_key = f"{settings.SLI_KEY_PREFIX}:drift"
    r.hset(drift_key, str(drifting.pk), json.dumps({"grade": "P1", "detected_at": time.time()}))
    agent = {"node": "node-a", "at": time.time(), "provider": "simulated", "simulated": True,
             "devices": 2, "hz": 1, "error": None}  # fmt: skip
    r.hset(gpu_keys()["status"], "node-a", json.dumps(agent))
    try:
        client.force_login(world_a.owner)
        assert client.get("/platform/status/").status_code == 302  # not staff: the admin login
        world_a.owner.is_staff = True
        world_a.owner.save(update_fields=["is_staff"])
        page = client.get("/platform/status/").content.decode()
    finally:
        r.hdel(drift_key, str(drifting.pk))
        r.hdel(gpu_keys()["status"], "node-a")
    deployments = _section(page, "fleet-deployments")
    assert "2 live across" in deployments and "running" in deployments and "pending" in deployments
    agents = _section(page, "fleet-agents")
    assert (
        "node-a" in agents and "simulated" in agents and "2 devices" in agents and "alive" in agents
    )
    drift = _section(page, "fleet-drift")
    assert "globex" in drift and "P1" in drift
    runs = _section(page, "fleet-reconciles")
    assert "failed" in runs and "Serve refused acme.assistant" in runs
    assert 'data-testid="fleet-nodes"' in page  # Ray is not running here: it says it cannot say
    assert "Ray cannot say right now" in _section(page, "fleet-nodes")


def test_the_fleet_with_no_data_still_renders(client: Client, world_a: TenantWorld) -> None:
    world_a.owner.is_staff = True
    world_a.owner.save(update_fields=["is_staff"])
    client.force_login(world_a.owner)
    page: Any = client.get("/platform/status/")
    assert page.status_code == 200
    assert "No deployment drifts." in page.content.decode()
