"""The alerts page: what fires now (the real health tick's findings) and the breach history
with filters (deployment, objective, severity, kind, day), each breach linked to its incident;
only the tenant's own."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health
from serving.ops.contracts import contract_set
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.factories import breach, deployment_of
from tests.serving.test_ops_pages import CONTRACT, publish_sli

pytestmark = pytest.mark.django_db


def _ids(html: str) -> list[int]:
    return [int(part.split('"')[0]) for part in html.split('data-breach="')[1:]]


def test_firing_now_and_the_breach_history_with_filters(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = deployment_of(world_a)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    contract_set(tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
                 source=CONTRACT)  # fmt: skip
    publish_sli(deployment, "stable", ok=90, failed=10)
    health.tick(now=time.time(), act=False)
    now = timezone.now()
    old, incident, _ = breach(world_a, detected_at=now - timedelta(days=3))
    ticket = breach(world_a, objective="p95", severity="ticket", kind="fast")[0]
    breach(world_b)  # the neighbour's
    client.force_login(world_a.viewer)
    url = reverse("alerts", args=[world_a.tenant.slug])
    page = client.get(url).content.decode()
    firing = page.split('data-testid="firing-now"')[1].split("</section>")[0]
    assert "error-spike" in firing and "availability" in firing and deployment.name in firing
    assert _ids(page) == [ticket.pk, old.pk]  # newest first; world_b's is not here
    assert f'href="{reverse("incident-detail", args=[world_a.tenant.slug, incident.pk])}"' in page
    assert _ids(client.get(url, {"severity": "ticket"}).content.decode()) == [ticket.pk]
    assert _ids(client.get(url, {"objective": "p95"}).content.decode()) == [ticket.pk]
    assert _ids(client.get(url, {"kind": "burn"}).content.decode()) == [old.pk]
    today = now.date()
    assert _ids(client.get(url, {"since": str(today)}).content.decode()) == [ticket.pk]
    assert _ids(client.get(url, {"deployment": deployment.pk}).content.decode()) == [
        ticket.pk,
        old.pk,
    ]
    foreign = client.get(url, {"deployment": deployment_of(world_b).pk}).content.decode()
    assert _ids(foreign) == [] and 'data-testid="filter-errors"' in foreign
    client.force_login(world_b.viewer)
    assert client.get(url).status_code == 404
