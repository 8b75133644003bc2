"""The cost panels of the new-deployment, scale and canary forms: what the deployment would
hold (now and after, for a change) against the quota (after the tenant's other live
deployments) and whether the cluster can place it, worked out from the form as it is filled;
a setting that makes no sense is named; nothing written."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from serving.deployments.models import Deployment
from tenants.models import AuditEvent, Quota
from tests.conftest import TenantWorld
from tests.serving.test_deployment_pages import (
    _create_data,
    _scale_data,
    _second_ready_version,
    _served_version,
)

pytestmark = pytest.mark.django_db


def _rows(html: str) -> dict[str, str]:
    rows = {}
    for part in html.split('data-testid="cost-row"')[1:]:
        key = part.split('data-resource="')[1].split('"')[0]
        rows[key] = part.split("</tr>")[0]
    return rows


def test_the_panel_adds_the_new_deployment_to_what_the_tenant_holds(
    client: Any, world_a: TenantWorld
) -> None:
    client.force_login(world_a.operator)
    url = reverse("serving-deployment-cost", args=[world_a.tenant.slug])
    audit = AuditEvent.objects.count()
    html = client.post(url, _create_data(world_a, num_replicas=2, kv_blocks=128)).content.decode()
    rows = _rows(html)
    # The world's "assistant" holds 1 replica and 256 blocks; this one 2 and 2 x 128.
    assert 'data-over="false"' in rows["replicas"] and "3 of 4" in rows["replicas"]
    assert "512 of 4096" in rows["kv_blocks"] and "2 of 3" in rows["deployments"]
    assert 'data-testid="cost-cluster"' in html  # Ray's answer (unknown in this test)
    over = client.post(url, _create_data(world_a, num_replicas=4)).content.decode()
    assert 'data-over="true"' in _rows(over)["replicas"] and 'data-testid="cost-refused"' in over
    Quota.objects.filter(tenant=world_a.tenant).update(max_replicas=10)
    assert (
        'data-testid="cost-refused"'
        not in client.post(url, _create_data(world_a, num_replicas=4)).content.decode()
    )
    # Nothing was written: no deployment, no audit row.
    assert Deployment.objects.filter(tenant=world_a.tenant).count() == 1
    assert AuditEvent.objects.count() == audit


def test_a_setting_that_makes_no_sense_is_named_and_the_name_is_not_needed(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    client.force_login(world_a.operator)
    url = reverse("serving-deployment-cost", args=[world_a.tenant.slug])
    unnamed = client.post(url, _create_data(world_a, name="")).content.decode()
    assert 'data-testid="cost-table"' in unnamed  # the cost does not depend on the name
    bad = client.post(url, _create_data(world_a, num_cpus=-1)).content.decode()
    assert 'data-testid="cost-problems"' in bad and "CPUs per replica" in bad
    foreign = Deployment.objects.get(tenant=world_b.tenant).current_revision.stable_version_id
    other = client.post(url, _create_data(world_a, version=foreign)).content.decode()
    assert 'data-testid="cost-problems"' in other and "Version" in other


def test_only_deployers_of_the_tenant_may_ask(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    url = reverse("serving-deployment-cost", args=[world_a.tenant.slug])
    client.force_login(world_a.viewer)
    assert client.post(url, _create_data(world_a)).status_code == 403
    client.force_login(world_b.owner)
    assert client.post(url, _create_data(world_a)).status_code == 404
    client.force_login(world_a.owner)
    assert client.get(url).status_code == 405
    page = client.get(reverse("serving-deployments", args=[world_a.tenant.slug])).content.decode()
    assert f'hx-post="{url}"' in page and 'data-testid="deploy-cost"' in page


def test_the_scale_and_canary_panels_show_now_and_after_the_change(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    revision = deployment.current_revision
    client.force_login(world_a.operator)
    slug, pk = world_a.tenant.slug, deployment.pk
    scale = reverse("serving-deployment-change-cost", args=[slug, pk, "scale"])
    s2 = _second_ready_version(world_a)
    audit, revisions = AuditEvent.objects.count(), deployment.revisions.count()
    html = client.post(scale, _scale_data(revision, num_replicas=3)).content.decode()
    rows = _rows(html)
    # "assistant" is the tenant's only deployment: 1 replica now, 3 after, of 4.
    assert 'data-testid="cost-before">1<' in rows["replicas"]
    assert 'data-testid="cost-this">3<' in rows["replicas"] and "3 of 4" in rows["replicas"]
    assert "1 of 3" in rows["deployments"] and 'data-over="false"' in rows["replicas"]
    over = client.post(scale, _scale_data(revision, num_replicas=5)).content.decode()
    assert 'data-over="true"' in _rows(over)["replicas"] and "Applying it would be refused" in over
    bad = client.post(scale, _scale_data(revision, num_cpus=-1)).content.decode()
    assert 'data-testid="cost-problems"' in bad and "CPUs per replica" in bad

    canary = reverse("serving-deployment-change-cost", args=[slug, pk, "canary"])
    html = client.post(canary, {"version": s2.pk, "percent": 20}).content.decode()
    rows = _rows(html)  # a canary adds a replica of its own
    assert 'data-testid="cost-before">1<' in rows["replicas"]
    assert 'data-testid="cost-this">2<' in rows["replicas"], rows["replicas"]
    same = client.post(canary, {"version": _served_version(world_a).pk, "percent": 20})
    assert "Canary version" in same.content.decode()  # not a canary candidate: named
    high = client.post(canary, {"version": s2.pk, "percent": 150}).content.decode()
    assert 'data-testid="cost-problems"' in high and "Canary traffic" in high
    # Nothing was written.
    assert deployment.revisions.count() == revisions and AuditEvent.objects.count() == audit
    # The panels sit inside the forms, and only a deployer of the tenant may ask.
    page = client.get(reverse("serving-deployment", args=[slug, pk])).content.decode()
    assert 'data-testid="scale-cost"' in page and 'data-testid="canary-cost"' in page
    assert (
        client.post(reverse("serving-deployment-change-cost", args=[slug, pk, "x"])).status_code
        == 404
    )
    client.force_login(world_a.viewer)
    assert client.post(scale, _scale_data(revision)).status_code == 403
    client.force_login(world_b.owner)
    assert client.post(scale, _scale_data(revision)).status_code == 404


def test_the_panel_refuses_a_replica_over_the_gpu_memory_cap_as_the_create_would(
    client: Any, world_a: TenantWorld
) -> None:
    """Within every quota total but one replica over the tenant's GPU memory cap: the create
    refuses it (tests/serving/test_gpu_memory_cap.py), so the preview does not say it fits."""
    Quota.objects.filter(tenant=world_a.tenant).update(
        max_gpu_memory_mb_per_replica=40, max_kv_blocks=100_000
    )
    client.force_login(world_a.operator)
    url = reverse("serving-deployment-cost", args=[world_a.tenant.slug])
    html = client.post(url, _create_data(world_a, kv_blocks=3000)).content.decode()
    assert 'data-testid="cost-problems"' in html and "max_gpu_memory_mb_per_replica" in html
    assert "KV" in html.split('data-testid="cost-problems"')[1]  # the field it names
    fits = client.post(url, _create_data(world_a, kv_blocks=256)).content.decode()
    assert 'data-testid="cost-table"' in fits and 'data-testid="cost-problems"' not in fits
