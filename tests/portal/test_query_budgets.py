"""Query budgets (issue 19, item 5): every page a tenant keeps open renders in a fixed number
of SQL queries, the same with 3 deployments as with 100 (each with a canary on every other
one, an SLA contract, stored SLI rows, an open incident on every fifth and a rollback on every
tenth), and never more than QUERY_BUDGET. A page that loops over deployments with a query
each fails here long before a tenant notices. Render times over the same fleet with a week of
history: `python -m bench pages` (bench/README.md)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from incidents.models import Incident, Severity
from serving.deployments.models import Deployment, DeploymentRevision, DeploymentStatus
from serving.ops.contracts import contract_set
from serving.ops.models import Rollback, SlaContract
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld
from tests.incidents.slis import sample
from tests.serving.test_ops_pages import CONTRACT

pytestmark = pytest.mark.django_db

QUERY_BUDGET = 25
# Tenant-wide pages (they list or sum every deployment) and one deployment's pages.
TENANT_PAGES = {
    "home": "tenant-overview",
    "home (live part)": "tenant-overview-live",
    "deployments": "serving-deployments",
    "models": "serving-models",
    "gpus": "serving-gpus",
    "pools": "serving-pools",
    "alerts": "alerts",
    "incidents": "incident-list",
    "analytics": "incident-analytics-page",
    "drills": "drills",
    "notifications": "notification-channels",
    "cause rules": "cause-rules",
    "audit": "tenant-audit",
}
DEPLOYMENT_PAGES = {
    "deployment": "serving-deployment",
    "health": "serving-deployment-health",
    "health (live part)": "serving-deployment-health-live",
    "contract": "serving-deployment-contract",
    "rollouts": "serving-deployment-rollouts",
    "requests": "serving-deployment-requests",
    "compare": "serving-deployment-compare",
    "playground": "serving-deployment-playground",
    "breaker": "serving-deployment-breaker",
}


def _grow(world: TenantWorld, total: int) -> None:
    """Deployments cloned from the world's running one up to `total`, in bulk, with what the
    pages read of each: revision (a canary on every other), contract, SLI rows, incidents,
    rollbacks."""
    first = Deployment.objects.get(tenant=world.tenant, name="assistant")
    template = first.current_revision
    contract = SlaContract.objects.get(deployment=first)
    have = Deployment.objects.filter(tenant=world.tenant).count()
    now = timezone.now()
    made = Deployment.objects.bulk_create(
        Deployment(tenant=world.tenant, name=f"d{n:03d}", status=DeploymentStatus.RUNNING,
                   status_at=now, created_by=world.owner)
        for n in range(have, total)
    )  # fmt: skip
    revisions = DeploymentRevision.objects.bulk_create(
        DeploymentRevision(tenant=world.tenant, deployment=d, number=1, reason="test",
                           stable_version=template.stable_version,
                           canary_version=template.stable_version if i % 2 else None,
                           canary_percent=10 if i % 2 else 0, num_replicas=1,
                           created_by=world.owner, applied_at=now, serve_status="RUNNING")
        for i, d in enumerate(made)
    )  # fmt: skip
    for d, revision in zip(made, revisions, strict=True):
        d.current_revision = d.last_good_revision = revision
    Deployment.objects.bulk_update(made, ["current_revision", "last_good_revision"])
    SlaContract.objects.bulk_create(
        SlaContract(tenant=world.tenant, deployment=d, version=1, name=contract.name,
                    source=contract.source, document=contract.document, created_by=world.owner)
        for d in made
    )  # fmt: skip
    for n, d in enumerate(made, start=have):
        for group in ("stable", "canary") if d.current_revision.canary_version_id else ("stable",):
            sample(d, now, group=group, requests=100, errors=n % 3)
        if n % 5 == 1:  # the first clone has one: an empty list skips its prefetches
            Incident.objects.create(tenant=world.tenant, deployment=d, title=f"i{n}",
                                    severity=Severity.PAGE, dedup_key=f"budget-{n}")  # fmt: skip
        if n % 10 == 1:
            Rollback.objects.create(tenant=world.tenant, deployment=d, key=f"budget-{n}",
                                    trigger="manual", from_revision=d.current_revision,
                                    to_revision=d.current_revision, detected_at=now)  # fmt: skip


def _counts(client: Any, urls: dict[str, str]) -> dict[str, int]:
    counts = {}
    for name, url in urls.items():
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, (name, response.status_code)
        counts[name] = len(queries)
    return counts


def test_every_page_renders_in_a_fixed_number_of_queries_up_to_100_deployments(
    client: Any, world_a: TenantWorld
) -> None:
    tenant = world_a.tenant
    first = Deployment.objects.get(tenant=tenant, name="assistant")
    Deployment.objects.filter(pk=first.pk).update(status=DeploymentStatus.RUNNING)
    contract_set(tenant=tenant, actor=Actor(user=world_a.owner), deployment=first, source=CONTRACT)
    Quota.objects.filter(tenant=tenant).update(max_deployments=200, max_replicas=400)
    urls = {name: reverse(view, args=[tenant.slug]) for name, view in TENANT_PAGES.items()}
    kw = {"slug": tenant.slug, "pk": first.pk}
    urls |= {name: reverse(view, kwargs=kw) for name, view in DEPLOYMENT_PAGES.items()}
    client.force_login(world_a.owner)
    _grow(world_a, 3)
    _counts(client, urls)  # warm: the first render fills per-process caches
    few = _counts(client, urls)
    _grow(world_a, 100)
    assert Deployment.objects.filter(tenant=tenant).count() == 100
    many = _counts(client, urls)
    grew = {name: (few[name], many[name]) for name in urls if many[name] != few[name]}
    assert not grew, f"queries grew with the number of deployments (3 -> 100): {grew}"
    over = {name: n for name, n in many.items() if n > QUERY_BUDGET}
    assert not over, f"over the budget of {QUERY_BUDGET} queries: {over}"
