"""Inference keys' priority class through the API, the page and the revision the router
follows: created realtime by default or batch on request, listed with the key, a bad value
refused naming `priority` with nothing written, batch hashes never shown or audited."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from portal.exceptions import ValidationFailed
from serving.deployments import services
from serving.deployments.models import Deployment, DeploymentRevision, InferenceKey
from serving.deployments.specs import desired_state
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _deployment(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant", deleted_at__isnull=True)


def _api(world: TenantWorld) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_token}")
    return client


def _router_spec(world: TenantWorld) -> Any:
    specs, _, _ = desired_state()
    return next(s for s in specs if s.tenant_id == str(world.tenant.pk))


def test_api_creates_batch_and_realtime_keys_and_lists_their_class(world_a: TenantWorld) -> None:
    deployment, api = _deployment(world_a), _api(world_a)
    url = f"/api/v1/deployments/{deployment.pk}/keys/"
    batch = api.post(url, {"name": "nightly", "priority": "batch"}, format="json")
    assert batch.status_code == 201, batch.content
    assert batch.json()["priority"] == "batch" and batch.json()["key"].startswith("ik_")
    plain = api.post(url, {"name": "web"}, format="json")
    assert plain.status_code == 201 and plain.json()["priority"] == "realtime"
    listed = {k["name"]: k["priority"] for k in api.get(url).json()}
    assert listed["nightly"] == "batch" and listed["web"] == "realtime"
    assert listed["default"] == "realtime"  # keys from before priority classes
    everywhere = api.get("/api/v1/inference-keys/").json()
    rows = everywhere["results"] if isinstance(everywhere, dict) else everywhere
    assert {k["name"]: k["priority"] for k in rows}["nightly"] == "batch"
    # The revision the router follows: every live key, and which of them are batch.
    nightly = InferenceKey.objects.get(deployment=deployment, name="nightly")
    revision = Deployment.objects.get(pk=deployment.pk).current_revision
    assert revision is not None
    assert revision.batch_key_hashes == [nightly.key_hash]
    assert nightly.key_hash in revision.key_hashes
    spec = _router_spec(world_a)
    assert spec.batch_key_hashes == (nightly.key_hash,)
    # Revoked: its hash leaves both lists.
    assert api.post(f"/api/v1/inference-keys/{nightly.pk}/revoke/").status_code == 200
    revision = Deployment.objects.get(pk=deployment.pk).current_revision
    assert revision is not None and revision.batch_key_hashes == []
    assert nightly.key_hash not in revision.key_hashes
    for event in AuditEvent.objects.filter(tenant=world_a.tenant):
        assert nightly.key_hash not in str(event.before) + str(event.after)


@pytest.mark.parametrize("bad", ["urgent", "", "REALTIME", 1, ["batch"], None])
def test_api_refuses_a_bad_priority_naming_it_and_writes_nothing(
    world_a: TenantWorld, bad: Any
) -> None:
    deployment = _deployment(world_a)
    revisions = DeploymentRevision.objects.filter(deployment=deployment).count()
    response = _api(world_a).post(
        f"/api/v1/deployments/{deployment.pk}/keys/",
        {"name": "x", "priority": bad},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "priority" in response.json()["error"]["fields"]
    assert not InferenceKey.objects.filter(deployment=deployment, name="x").exists()
    assert DeploymentRevision.objects.filter(deployment=deployment).count() == revisions


def test_the_service_refuses_a_bad_priority(world_a: TenantWorld) -> None:
    with pytest.raises(ValidationFailed) as refused:
        services.inference_key_create(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                                      deployment=_deployment(world_a), name="x",
                                      priority="vip")  # fmt: skip
    assert refused.value.field == "priority"
    assert not InferenceKey.objects.filter(name="x").exists()


def test_the_page_creates_a_batch_key_shows_its_class_and_refuses_a_bad_one(
    client: Any, world_a: TenantWorld
) -> None:
    client.force_login(world_a.owner)
    deployment = _deployment(world_a)
    kwargs = {"slug": world_a.tenant.slug, "pk": deployment.pk}
    detail, create = (reverse(n, kwargs=kwargs) for n in ("serving-deployment",
                                                          "serving-deployment-key-create"))  # fmt: skip
    page = client.get(detail)
    assert page.status_code == 200
    form = page.content.decode().split('data-testid="key-form"')[1].split("</form>")[0]
    assert 'name="priority"' in form and 'value="batch"' in form
    created = client.post(create, {"name": "nightly", "priority": "batch"})
    assert created.status_code == 200 and b'data-testid="new-key"' in created.content
    assert InferenceKey.objects.get(deployment=deployment, name="nightly").priority == "batch"
    rows = client.get(detail).content.decode().split('data-testid="key-row"')[1:]
    classes = {row.split("</td>")[0].split(">")[-1].strip(): row for row in rows}
    assert 'data-testid="key-priority">batch<' in classes["nightly"]
    assert 'data-testid="key-priority">realtime<' in classes["default"]
    refused = client.post(create, {"name": "bad", "priority": "urgent"})
    form = refused.content.decode().split('data-testid="key-form"')[1].split("</form>")[0]
    assert "errorlist" in form and "urgent" in form  # Django names the refused choice
    assert not InferenceKey.objects.filter(deployment=deployment, name="bad").exists()
