"""Hostile tenant against the issue-19 pages: the contract editor's check as you type (a YAML
alias bomb costs the node budget, never memory), the deploy form's cost preview (another
tenant's version is refused, naming the field; a posted pool is ignored), and the audit
export (a drill named like a spreadsheet formula is exported as text)."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.urls import reverse

from serving.deployments.models import Deployment, SharedPool
from tests.conftest import TenantWorld
from tests.serving.test_deployment_pages import _create_data

pytestmark = pytest.mark.django_db

# Nine levels of nine aliases: 9**9 (387 million) nodes once expanded.
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def test_an_alias_bomb_in_the_editor_is_refused_by_the_node_budget(
    client: Any, world_a: TenantWorld
) -> None:
    client.force_login(world_a.operator)
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    url = reverse("serving-deployment-contract-check", args=[world_a.tenant.slug, deployment.pk])
    result = client.post(url, {"source": BOMB}).json()
    assert result["ok"] is False
    assert "too large or too deeply nested" in result["errors"][0]["message"]


def test_the_cost_preview_refuses_a_neighbours_version_and_ignores_a_pool(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    closed = SharedPool.objects.create(name="theirs", model_version=world_b.version)
    closed.allowed_tenants.add(world_b.tenant)
    client.force_login(world_a.owner)
    url = reverse("serving-deployment-cost", args=[world_a.tenant.slug])
    foreign = Deployment.objects.get(tenant=world_b.tenant).current_revision.stable_version_id
    page = client.post(url, _create_data(world_a, version=foreign)).content.decode()
    assert 'data-testid="cost-problems"' in page and "cost-table" not in page
    # The page's form has no pool field: a posted pool is ignored (a dedicated deployment's
    # cost), and nothing of the neighbour's pool shows.
    page = client.post(url, _create_data(world_a, kv_mode="shared", pool="theirs")).content.decode()
    assert 'data-testid="cost-table"' in page and "theirs" not in page


def test_a_formula_named_drill_is_text_in_the_audit_export(
    client: Any, world_a: TenantWorld
) -> None:
    from incidents import drills
    from tenants.actors import Actor

    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    drills.drill_create(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                        deployment=deployment, name='=HYPERLINK("http://evil.example")',
                        fault="latency_spike", group="stable", parameters={})  # fmt: skip
    client.force_login(world_a.owner)
    response = client.get(reverse("tenant-audit", args=[world_a.tenant.slug]), {"format": "csv"})
    body = b"".join(response.streaming_content).decode()
    rows = [r for r in csv.DictReader(io.StringIO(body)) if r["action"] == "drill.created"]
    assert rows and rows[0]["object"].startswith("'=HYPERLINK")
    assert all(not cell.startswith(("=", "+", "-", "@")) for r in rows for cell in r.values())
