"""Config drift on the real Ray cluster: someone PUTs configs to Serve behind the portal's back.
A different traffic split is P0: the status refresh (the beat task) records it on the incident
timeline (paged), shows it on the deployment page and re-applies the portal's config; a
cosmetic difference (a log level) is P2: recorded as a ticket, not paged, left alone."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from incidents.models import EventKind, Incident, SlaBreach
from serving.control import isolate
from serving.control.serve_api import ServeApiClient
from serving.deployments import drift
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, ReconcileLock
from serving.deployments.specs import plan_base
from serving.deployments.tasks import refresh_deployment_status
from serving.engine.testing import write_tiny_checkpoint
from serving.registry import services as registry
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


def _applied_config(cluster: RayCluster) -> dict[str, Any]:
    """The whole declarative config the portal PUT last (what a hand-made PUT starts from)."""
    lock = ReconcileLock.objects.get(id=1)
    return plan_base(cluster.target).config(isolate.units_from_json(lock.applied_config))


def _router(config: dict[str, Any], app: str) -> dict[str, Any]:
    [found] = [a for a in config["applications"] if a["name"] == app]
    return dict(found["deployments"][0])


def _reported(client: ServeApiClient, app: str) -> dict[str, Any]:
    info = client.applications()[app]
    assert info.deployed_config is not None
    return dict(info.deployed_config["deployments"][0])


def _wait(check: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def _settled() -> None:
    """Past the settle time after the portal's last PUT (drift.SETTLE_S)."""
    lock = ReconcileLock.objects.get(id=1)
    assert lock.last_applied_at is not None
    left = lock.last_applied_at.timestamp() + drift.SETTLE_S + 0.2 - time.time()
    if left > 0:
        time.sleep(left)


def test_drift_behind_the_portals_back_is_graded_recorded_and_repaired(
    world_a: TenantWorld,
    world_b: TenantWorld,
    ray_cluster: RayCluster,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    Deployment.objects.exclude(pk=deployment.pk).update(deleted_at=timezone.now())
    app = deployment.serve_app
    # A canary too, so that a version server's application is compared as well.
    model = deployment.current_revision.stable_version.model
    v2 = registry.version_register_path(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        model=model,
        label="v2",
        path=str(write_tiny_checkpoint(tmp_path / "v2", seed=7)),
    )
    registry.version_validate(tenant=world_a.tenant, version_id=v2.pk)
    deployments.deployment_set_canary(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        deployment=deployment,
        version_id=v2.pk,
        percent=0,
    )
    deployment.refresh_from_db()
    client = ray_cluster.client()
    before = max((a.last_deployed_time_s for a in client.applications().values()), default=0)
    control.reconcile(target=ray_cluster.target, client=client)
    apps = [app, f"{app}.canary"]
    client.wait_until(apps, deployed_after=before - 0.001, timeout=180)
    assert set(apps) <= set(client.applications())
    for name, value in ray_cluster.portal_env().items():
        monkeypatch.setenv(name, value)
    _settled()

    # What the portal applied is what Serve reports: no drift.
    check = drift.drift_check(
        apps=client.applications(), read_at=time.time(), target=ray_cluster.target
    )
    assert check.skipped == "" and check.findings == []
    # Serve read just before the portal's last PUT: not comparable, skipped.
    lock = ReconcileLock.objects.get(id=1)
    assert lock.last_applied_at is not None
    early = lock.last_applied_at.timestamp() - 1
    skipped = drift.drift_check(apps=client.applications(), read_at=early).skipped
    assert skipped == "applied since Serve was read"

    applied = _applied_config(ray_cluster)
    member = Client()
    member.force_login(world_a.viewer)
    status_url = reverse("serving-deployment-status", args=[world_a.tenant.slug, deployment.pk])

    # P2: someone turns a log level up, straight on Serve.
    cosmetic = copy.deepcopy(applied)
    for config in cosmetic["applications"]:
        if config["name"] == app:
            config["deployments"][0]["logging_config"] = {"log_level": "DEBUG"}
    client.put(cosmetic)
    _wait(lambda: "logging_config" in _reported(client, app))
    refresh_deployment_status()
    state = drift.drift_state(deployment)
    assert state is not None and state["current"] and state["grade"] == "P2"
    assert state["fields"] == [f"{app}: deployments[router].logging_config.log_level"]
    assert "logging_config" in _reported(client, app)  # recorded, not re-applied
    incident = Incident.objects.get(tenant=world_a.tenant, deployment=deployment)
    assert incident.severity == "ticket"  # recorded, not paged
    breach = SlaBreach.objects.get(incident=incident, objective="config-drift-P2")
    assert breach.kind == "drift" and breach.observed["grade"] == "P2"
    assert breach.observed["fields"] == state["fields"]
    refresh_deployment_status()  # the same drift again: told once
    assert SlaBreach.objects.get(pk=breach.pk).occurrences == 1
    page = member.get(status_url).content.decode()
    assert 'data-testid="drift-badge" data-grade="P2" data-current="true"' in page
    assert "logging_config.log_level" in page

    # P0: someone sends half the traffic to a canary, straight on Serve.
    split = copy.deepcopy(applied)
    for config in split["applications"]:
        if config["name"] == app:
            config["deployments"][0]["user_config"]["canary_percent"] = 50
    assert _router(applied, app)["user_config"]["canary_percent"] == 0
    client.put(split)
    _wait(lambda: _reported(client, app)["user_config"]["canary_percent"] == 50)
    runs = control.ReconcileRun.objects.count()
    _settled()
    refresh_deployment_status()
    # Re-applied at once (a forced reconcile): the split and the log level are the portal's.
    assert control.ReconcileRun.objects.count() == runs + 1
    assert _reported(client, app)["user_config"]["canary_percent"] == 0
    assert "logging_config" not in _reported(client, app)
    state = drift.drift_state(deployment)
    assert state is not None and state["grade"] == "P0"
    assert f"{app}: deployments[router].user_config.canary_percent" in state["fields"]
    incident.refresh_from_db()
    assert incident.severity == "page"  # the P0 breach joined the incident and paged
    event = incident.events.filter(kind=EventKind.BREACH).order_by("-at", "-id").first()
    assert event is not None and event.data["objective"] == "config-drift-P0"
    assert "P0 config drift" in event.message and "canary_percent" in event.message
    assert "re-applied" in event.message
    assert "redis://" not in str(SlaBreach.objects.get(objective="config-drift-P0").observed)
    page = member.get(status_url).content.decode()
    assert 'data-grade="P0"' in page and "canary_percent" in page

    # The next refresh finds Serve running the portal's config: the drift shows repaired.
    _settled()
    refresh_deployment_status()
    state = drift.drift_state(deployment)
    assert state is not None and not state["current"] and state["repaired"]
    assert 'data-current="false"' in member.get(status_url).content.decode()
    # Another tenant's member sees none of it (the page is the tenant's own).
    other = Client()
    other.force_login(world_b.owner)
    assert other.get(status_url).status_code == 404
    assert not Incident.objects.filter(tenant=world_b.tenant).exists()
