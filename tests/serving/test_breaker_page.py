"""The guard and breaker page: the routers' live breakers per slot from the snapshots they
publish to Redis (written here as a router writes them), the settings in force beside their
defaults, and the form that changes them through the deployment settings service (a new
revision, audited, the same bounds as the API); roles, another tenant, hostile values."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import redis
from django.conf import settings
from django.urls import reverse

from serving.dataplane.breaker import BreakerConfig, CircuitBreaker
from serving.deployments.models import Deployment
from tenants.models import AuditEvent
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _deployment(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant")


def _url(
    world: TenantWorld, deployment: Deployment, name: str = "serving-deployment-breaker"
) -> str:
    return reverse(name, kwargs={"slug": world.tenant.slug, "pk": deployment.pk})


def _publish(deployment: Deployment, replica: str, breakers: dict[str, Any], at: float) -> None:
    """One router replica's snapshot, in the hash serving.dataplane.answers.publish_router
    writes (`<prefix>:router:<app>`, a JSON value per replica)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.SLI_KEY_PREFIX}:router:{deployment.serve_app}"
    value = {"app": deployment.serve_app, "replica": replica, "at": at, "breakers": breakers}
    client.hset(key, replica, json.dumps(value))
    client.expire(key, 30)


def _tripped() -> dict[str, Any]:
    """A real breaker's snapshot after enough failures to open it."""
    breaker = CircuitBreaker(BreakerConfig(min_requests=4, failure_rate=0.5))
    for ok in (True, False, False, False):
        breaker.record(ok)
    return breaker.snapshot()


def _form(**changes: Any) -> dict[str, Any]:
    return {
        f"breaker_{k}" if k in BreakerConfig.__dataclass_fields__ else f"guard_{k}": v
        for k, v in changes.items()
    }


def test_live_breakers_per_slot_from_the_routers_snapshots(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    client.force_login(world_a.viewer)
    none = client.get(_url(world_a, deployment, "serving-deployment-breaker-live")).content
    assert b'data-testid="breaker-none"' in none
    now = time.time()
    closed = CircuitBreaker().snapshot()
    tripped = _tripped()
    assert tripped["state"] == "open"
    half_open = {**closed, "state": "half_open", "trips": 2, "failure_rate": 0.75, "mirrored": 4}
    _publish(deployment, "router-a", {"stable": closed, "canary": tripped}, now)
    _publish(deployment, "router-b", {"stable": closed, "canary": half_open}, now - 1)
    _publish(deployment, "router-gone", {"stable": {**closed, "state": "open"}}, now - 60)
    page = client.get(_url(world_a, deployment))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'hx-trigger="every 5s"' in html
    arms = re.findall(r'data-testid="breaker-arm" data-group="(\w+)" data-state="(\w+)"', html)
    # The stale replica's open breaker does not count; the canary shows its worst fresh state.
    assert arms == [("stable", "closed"), ("canary", "open")]
    canary = html.split('data-group="canary"')[1]
    # Summed over the fresh replicas: the tripped one's 3 failures and 1 trip, the other's 2
    # (and the calls it mirrored while its canary was suspect).
    assert "3 failures · 3 trips · 0 turned away · 4 mirrored · 2 of 2 replicas fresh" in canary
    assert "half open" in canary and "75%" in canary
    assert html.count('<span class="badge stale">stale</span>') == 1
    live = client.get(_url(world_a, deployment, "serving-deployment-breaker-live"))
    assert live.status_code == 200 and b'data-testid="breaker-arm"' in live.content


def test_settings_in_force_with_their_defaults(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.viewer)
    html = client.get(_url(world_a, _deployment(world_a))).content.decode()
    row = re.search(r'data-setting="breaker.min_requests">.*?</tr>', html, re.S)
    assert row and '<td class="num" data-testid="in-force">20</td>' in row.group(0)
    assert "1 – 100000" in row.group(0)
    assert 'data-setting="guard.max_tokens"' in html
    assert 'data-testid="breaker-form"' not in html  # a viewer reads, nothing to submit


def test_a_writer_changes_them_through_the_settings_service_audited(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    before = deployment.current_revision
    client.force_login(world_a.operator)
    assert 'data-testid="breaker-form"' in client.get(_url(world_a, deployment)).content.decode()
    response = client.post(
        _url(world_a, deployment),
        _form(min_requests="50", failure_rate="0.25", open_s="", max_tokens="256"),
        follow=True,
    )
    assert response.status_code == 200
    deployment.refresh_from_db()
    revision = deployment.current_revision
    assert revision.number == before.number + 1
    assert revision.breaker == {"min_requests": 50, "failure_rate": 0.25}
    assert revision.guard == {"max_tokens": 256}
    assert "changed breaker, guard" in response.content.decode()
    audit = AuditEvent.objects.filter(tenant=world_a.tenant, action="deployment.changed").latest(
        "id"
    )
    assert audit.actor == world_a.operator and audit.object_id == str(deployment.pk)
    assert audit.before["breaker"] == {} and audit.after["breaker"]["min_requests"] == 50
    html = response.content.decode()
    row = re.search(r'data-setting="breaker.min_requests">.*?</tr>', html, re.S)
    assert row and '<td class="num" data-testid="in-force">50</td>' in row.group(0)
    # The same values again: no new revision.
    again = client.post(
        _url(world_a, deployment),
        _form(min_requests="50", failure_rate="0.25", max_tokens="256"),
        follow=True,
    )
    assert "Nothing changed." in again.content.decode()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("min_requests", str(10**12), "must be between 1 and 100000."),
        ("failure_rate", "5", "must be between 0.01 and 1."),
        ("half_open_probes", "2.5", "must be a whole number."),
        ("max_body_bytes", "-1", "must be between 1 and 16777216."),
        ("window_s", "lots", "Enter a number."),
        ("open_s", "1e400", "Enter a number."),
    ],
)
def test_hostile_values_are_refused_next_to_their_field(
    client: Any, world_a: TenantWorld, field: str, value: str, message: str
) -> None:
    deployment = _deployment(world_a)
    before = deployment.current_revision_id
    client.force_login(world_a.owner)
    response = client.post(_url(world_a, deployment), _form(**{field: value}))
    assert response.status_code == 400
    html = response.content.decode()
    name = next(iter(_form(**{field: value})))
    block = html.split(f'data-field="{name}"')[1].split("data-field=")[0].split("</fieldset>")[0]
    assert message in block
    deployment.refresh_from_db()
    assert deployment.current_revision_id == before


def test_a_viewer_cannot_change_them_and_another_tenant_is_not_found(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    before = deployment.current_revision_id
    client.force_login(world_a.viewer)
    assert client.post(_url(world_a, deployment), _form(min_requests="50")).status_code == 403
    deployment.refresh_from_db()
    assert deployment.current_revision_id == before
    client.force_login(world_a.owner)
    foreign = reverse(
        "serving-deployment-breaker",
        kwargs={"slug": world_a.tenant.slug, "pk": _deployment(world_b).pk},
    )
    assert client.get(foreign).status_code == 404
    assert client.post(foreign, _form(min_requests="50")).status_code == 404
    live = reverse(
        "serving-deployment-breaker-live",
        kwargs={"slug": world_a.tenant.slug, "pk": _deployment(world_b).pk},
    )
    assert client.get(live).status_code == 404
    # Another tenant's own page of its deployment, through the slug: not a member, 404.
    assert client.get(_url(world_b, _deployment(world_b))).status_code == 404
