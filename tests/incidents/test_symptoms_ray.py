"""Symptoms from a real Serve: a version whose weights vanish after validation fails to load in
its replicas; Serve's own message, copied into the deployment by the status refresh, becomes a
"load failure" evidence item of the incident and the top hint."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from incidents import services as incidents
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentStatus
from serving.engine.testing import write_tiny_checkpoint
from serving.registry import services
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


def test_serves_load_failure_is_evidence_of_the_incident(
    world_a: TenantWorld, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    directory = write_tiny_checkpoint(tmp_path / "vanishing", seed=5)
    owner = Actor(user=world_a.owner)
    served = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    version = services.version_register_path(
        tenant=world_a.tenant, actor=owner, model=served.current_revision.stable_version.model,
        label="vanishing", path=str(directory),
    )  # fmt: skip
    version = services.version_validate(tenant=world_a.tenant, version_id=version.pk)
    Deployment.objects.filter(tenant=world_a.tenant).update(deleted_at=timezone.now())
    deployment, _ = deployments.deployment_create(
        tenant=world_a.tenant, actor=owner, name="broken", version_id=version.pk,
        settings={"num_cpus": 0.25},
    )  # fmt: skip
    (directory / "model.safetensors").unlink()  # gone after validation
    client = ray_cluster.client()
    control.reconcile(target=ray_cluster.target, client=client)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        control.refresh_status(client=client)
        deployment.refresh_from_db()
        if deployment.status == DeploymentStatus.FAILED:
            break
        time.sleep(1)
    assert deployment.status == DeploymentStatus.FAILED, deployment.status
    _, incident, _ = incidents.breach_record(
        tenant=world_a.tenant, deployment=deployment, group="stable", objective="availability",
        kind="probe", severity="page", action="notify", detail="the probe fails", observed={},
        detected_at=timezone.now(),
    )  # fmt: skip
    url = reverse("incident-hints", kwargs={"pk": incident.pk})
    hints = world_a.client("viewer").get(url).json()
    symptoms = {s["symptom"] for s in hints["symptoms"]}
    assert "load_failure" in symptoms, (deployment.status_message, hints["symptoms"])
    assert hints["hints"][0]["cause"] == "Model fails to load", hints["hints"]
