"""The hostile-tenant suite, version pages: through the page forms a tenant cannot verify
against its neighbour's contract, send unbounded prompts or gates, queue more checks than its
share, or change golden prompts faster than the hourly bucket; each refusal names the field
(or says why on the form), writes nothing, and the neighbour's versions and checks stay 404."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from serving.deployments.models import Deployment
from serving.ops import contracts
from serving.ops.checks import limits
from serving.ops.checks.models import CheckStatus, VersionCheck
from serving.registry.models import ModelVersion
from serving.registry.services.golden import GOLDEN_REQUESTS_PER_HOUR
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld
from tests.serving.test_version_checks import CONTRACT

pytestmark = pytest.mark.django_db


def _served(world: TenantWorld) -> tuple[Deployment, ModelVersion]:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    contracts.contract_set(
        tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment, source=CONTRACT
    )
    return deployment, deployment.current_revision.stable_version


def _url(name: str, version: ModelVersion) -> str:
    return reverse(
        name, kwargs={"slug": version.tenant.slug, "pk": version.model_id, "version_pk": version.pk}
    )


def test_a_hostile_tenants_page_forms_are_bounded_and_stay_in_its_tenant(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    _, version = _served(world_a)
    neighbour, neighbour_version = _served(world_b)
    client.force_login(world_a.operator)
    verify = _url("serving-version-verify", version)

    # The neighbour's deployment (it has a contract) is not a choice: named on the field.
    page = client.post(verify, {"deployment_id": neighbour.pk})
    assert page.status_code == 400 and "deployment_id" in page.context["verify_form"].errors
    # Oversized and NUL-laden text, too many gates: refused on their fields.
    big = client.post(_url("serving-version-golden", version), {"prompts": "x" * 100_000})
    assert big.status_code == 400 and "prompts" in big.context["golden_form"].errors
    nul = client.post(_url("serving-version-golden", version), {"prompts": "a\x00b"})
    assert nul.status_code == 400 and "prompts" in nul.context["golden_form"].errors
    own = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    gates = "\n".join(f"objective-{n}: block" for n in range(60))
    many = client.post(verify, {"deployment_id": own.pk, "gates": gates})
    assert many.status_code == 400 and "gates" in many.context["verify_form"].errors
    levels = client.post(_url("serving-version-benchmark", version), {"concurrencies": "1,2,3,4,5"})
    assert levels.status_code == 400 and "concurrencies" in levels.context["benchmark_form"].errors
    assert not VersionCheck.objects.exists()

    # More checks than its share at once: the third waits, said on the form.
    for _ in range(limits.MAX_ACTIVE_PER_TENANT):
        queued = client.post(_url("serving-version-benchmark", version), {"concurrencies": "1"})
        assert queued.status_code == 302
    third = client.post(_url("serving-version-benchmark", version), {"concurrencies": "1"})
    assert third.status_code == 400
    assert "already queued or running" in " ".join(
        third.context["benchmark_form"].non_field_errors()
    )
    assert (
        VersionCheck.objects.filter(tenant=world_a.tenant).count() == limits.MAX_ACTIVE_PER_TENANT
    )
    assert not VersionCheck.objects.filter(tenant=world_b.tenant).exists()
    VersionCheck.objects.filter(tenant=world_a.tenant).update(status=CheckStatus.FAILED)

    # Golden prompts: the hourly bucket, then 429 on the form; nothing more recorded.
    golden = _url("serving-version-golden", version)
    for n in range(GOLDEN_REQUESTS_PER_HOUR):
        assert client.post(golden, {"prompts": f"prompt {n}"}).status_code == 302
    flood = client.post(golden, {"prompts": "one more"})
    assert flood.status_code == 429 and "try again in" in flood.content.decode()
    requested = AuditEvent.objects.filter(tenant=world_a.tenant, action="version.golden_requested")
    assert requested.count() == GOLDEN_REQUESTS_PER_HOUR

    # The neighbour's version under its own slug and ids: 404, never a form error.
    foreign = {
        "slug": world_b.tenant.slug,
        "pk": neighbour_version.model_id,
        "version_pk": neighbour_version.pk,
    }
    assert client.get(reverse("serving-version", kwargs=foreign)).status_code == 404
    mine = {**foreign, "slug": world_a.tenant.slug}
    assert client.post(reverse("serving-version-verify", kwargs=mine), {}).status_code == 404
    asked = ("version.golden_requested", "version.verify_requested", "version.benchmark_requested")
    assert not AuditEvent.objects.filter(tenant=world_b.tenant, action__in=asked).exists()
