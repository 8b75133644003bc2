"""The contract editor's check as you type: every problem with its line and field, nothing
saved; the same limits as saving; deploy scope and the tenant's own deployments only. The
editor itself, in Chromium: tests/test_browser_pages.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from serving.deployments.models import Deployment
from serving.ops.contracts import contract_current
from serving.ops.forms import SOURCE_MAX_CHARS
from tests.conftest import TenantWorld
from tests.serving.test_ops_pages import CONTRACT

pytestmark = pytest.mark.django_db


def _url(world: TenantWorld) -> str:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    return reverse("serving-deployment-contract-check", args=[world.tenant.slug, deployment.pk])


def test_the_check_lists_every_problem_and_saves_nothing(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.operator)
    assert client.post(_url(world_a), {"source": CONTRACT}).json() == {"ok": True, "errors": []}
    bad = CONTRACT.replace("target: 0.99", "target: -0.5").replace("sli: availability", "sli: mood")
    result = client.post(_url(world_a), {"source": bad}).json()
    assert result["ok"] is False
    found = {(e["line"], e["field"]) for e in result["errors"]}
    assert (9, "spec.objectives[0].sli") in found and (10, "spec.objectives[0].target") in found
    broken = client.post(_url(world_a), {"source": "spec: [unclosed"}).json()
    assert broken["ok"] is False and "invalid YAML" in broken["errors"][0]["message"]
    huge = client.post(_url(world_a), {"source": "a" * (SOURCE_MAX_CHARS + 1)}).json()
    assert huge["ok"] is False and huge["errors"][0]["field"] == "source"
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    assert contract_current(tenant=world_a.tenant, deployment=deployment) is None


def test_the_check_needs_deploy_scope_and_the_tenants_own_deployment(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    client.force_login(world_a.viewer)
    assert client.post(_url(world_a), {"source": CONTRACT}).status_code == 403
    client.force_login(world_b.owner)
    assert client.post(_url(world_a), {"source": CONTRACT}).status_code == 404
    foreign = Deployment.objects.get(tenant=world_b.tenant, name="assistant")
    mixed = reverse("serving-deployment-contract-check", args=[world_a.tenant.slug, foreign.pk])
    client.force_login(world_a.owner)
    assert client.post(mixed, {"source": CONTRACT}).status_code == 404
    assert client.get(_url(world_a)).status_code == 405
