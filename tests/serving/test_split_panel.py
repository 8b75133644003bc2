"""Traffic hygiene on the portal side: the `traffic` setting (checked, naming the bad field; in
the revision; compiled into the router's user_config with the deployment's salt) and the
split-consistency panel, fed by router replicas' records published to the real Redis as the
data plane publishes them (serving.dataplane.answers.publish_router)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse

from portal.exceptions import ValidationFailed
from serving.dataplane.answers import publish_router
from serving.dataplane.sticky import SplitTracker
from serving.deployments import services as deploy
from serving.deployments.models import Deployment
from serving.deployments.specs import desired_state
from serving.deployments.traffic_specs import traffic_salt_hex
from serving.ops.split import split_consistency
from serving.registry import services as registry
from tenants.actors import Actor
from tests.conftest import TenantWorld, world_checkpoint

pytestmark = pytest.mark.django_db


def _deployment(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant")


def _with_canary(world: TenantWorld, percent: float, traffic: dict[str, Any]) -> Deployment:
    deployment = _deployment(world)
    actor = Actor(user=world.owner)
    model = deployment.current_revision.stable_version.model
    version = registry.version_register_path(
        tenant=world.tenant, actor=actor, model=model, label="s2", path=str(world_checkpoint())
    )
    registry.version_validate(tenant=world.tenant, version_id=version.pk)
    deploy.deployment_change(
        tenant=world.tenant, actor=actor, deployment=deployment, changes={"traffic": traffic},
        reason="sticky",
    )  # fmt: skip
    deploy.deployment_set_canary(
        tenant=world.tenant, actor=actor, deployment=deployment, version_id=version.pk,
        percent=percent,
    )  # fmt: skip
    deployment.refresh_from_db()
    return deployment


def _router_config(deployment: Deployment) -> dict[str, Any]:
    specs, _, _ = desired_state()
    spec = next(s for s in specs if s.deployment_id == deployment.pk)
    from serving.control.compile import deployment_apps

    return dict(deployment_apps(spec, {})[0]["deployments"][0]["user_config"])


def _publish(deployment: Deployment, replica: str, tracker: SplitTracker) -> None:
    snapshot = {"app": deployment.serve_app, "replica": replica, "split": tracker.snapshot()}

    async def send() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        await publish_router(client, settings.SLI_KEY_PREFIX, snapshot)
        await client.aclose()

    asyncio.run(send())


def test_traffic_setting_is_checked_and_compiled_with_a_per_deployment_salt(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = _with_canary(world_a, 30, {"sticky": True, "client_key_header": "X-User-Id"})
    revision = deployment.current_revision
    assert revision.traffic == {"sticky": True, "client_key_header": "x-user-id"}
    config = _router_config(deployment)
    traffic = config["traffic"]
    assert traffic["sticky"] and traffic["client_key_header"] == "x-user-id"
    assert traffic["user_field"] and traffic["salt"] == traffic_salt_hex(deployment.pk)
    assert config["fingerprints"]["canary"] == revision.canary_version.sha256
    other = _router_config(_deployment(world_b))
    assert other["traffic"]["salt"] != traffic["salt"] and not other["traffic"]["sticky"]
    # The API shows the setting, never the salt.
    shown = world_a.client().get(f"/api/v1/deployments/{deployment.pk}/").json()
    assert shown["revision"]["traffic"] == revision.traffic
    assert traffic["salt"] not in str(shown)

    actor = Actor(user=world_a.owner)
    bad = [
        ({"sticky": "yes"}, "traffic.sticky"),
        ({"client_key_header": "authorization"}, "traffic.client_key_header"),
        ({"client_key_header": "x" * 65}, "traffic.client_key_header"),
        ({"client_key_header": "x key"}, "traffic.client_key_header"),
        ({"client_key_header": 7}, "traffic.client_key_header"),
        ({"salt": "00"}, "traffic.salt"),
        ({"user_field": None}, "traffic.user_field"),
        ([True], "traffic"),
    ]
    for value, field in bad:
        with pytest.raises(ValidationFailed) as refused:
            deploy.deployment_change(
                tenant=world_a.tenant, actor=actor, deployment=deployment,
                changes={"traffic": value}, reason="bad",
            )  # fmt: skip
        assert refused.value.field == field, value
    deployment.refresh_from_db()
    assert deployment.current_revision.pk == revision.pk  # nothing half-written
    # Through the API: the same error, naming the field.
    response = world_a.client().patch(
        f"/api/v1/deployments/{deployment.pk}/",
        {"traffic": {"client_key_header": "cookie"}},
        format="json",
    )
    assert response.status_code == 400
    assert "traffic.client_key_header" in response.content.decode()


def test_split_panel_shows_consistency_observed_split_and_flipped_clients(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _with_canary(world_a, 30, {"sticky": True})
    config = _router_config(deployment)
    replicas = [SplitTracker(), SplitTracker()]
    for tracker in replicas:
        tracker.configure(config)
    keys = [f"customer-{n}@acme.example" for n in range(40)]
    clients = [replicas[0].client({"x-client-key": k}, {}) for k in keys]
    for n, c in enumerate(clients):
        assert c is not None
        expected = "canary" if c.bucket < 30 else "stable"
        # Each client on both replicas, always its bucket's group...
        replicas[n % 2].observe(c, expected)
        replicas[(n + 1) % 2].observe(c, expected)
    # ...except two that a breaker sent across once.
    flipped = clients[:2]
    for c in flipped:
        assert c is not None
        replicas[0].observe(c, "stable" if c.bucket < 30 else "canary")
    for _ in range(5):
        replicas[1].observe(None, "stable")
    _publish(deployment, "r1", replicas[0])
    _publish(deployment, "r2", replicas[1])
    # A replica still on the old split (mid-reconfigure) is not merged.
    old = SplitTracker()
    old.configure({**config, "canary_percent": 10})
    old.observe(clients[5], "canary")
    old.observe(clients[5], "stable")
    _publish(deployment, "r3", old)

    split = split_consistency(deployment=deployment)
    assert split is not None and split["reporting"] == 2 and split["stale"] == 1
    assert split["clients"] == 40 and split["flipped_total"] == 2
    assert split["consistency_pct"] == 95.0 and split["percent"] == 30
    assert {r["id"] for r in split["flipped"]} == {c.id for c in flipped if c}
    on_canary = sum(1 for c in clients if c and c.bucket < 30)
    assert split["requests"]["canary"] >= 2 * on_canary

    client.force_login(world_a.viewer)
    detail = reverse(
        "serving-deployment", kwargs={"slug": world_a.tenant.slug, "pk": deployment.pk}
    )
    assert "split-loading" in client.get(detail).content.decode()
    url = reverse(
        "serving-deployment-split", kwargs={"slug": world_a.tenant.slug, "pk": deployment.pk}
    )
    page = client.get(url).content.decode()
    assert 'data-testid="split-panel"' in page
    assert "95.0% of 40 clients always saw the same group" in page
    assert "30% canary" in page
    assert page.count('data-flipped="true"') == 2
    for c in flipped:
        assert c is not None and c.id in page
    assert not any(key in page for key in keys)  # hashes only, never a client's key
    assert config["traffic"]["salt"] not in page


def test_split_panel_without_records_and_when_redis_is_down(
    client: Any, world_a: TenantWorld, settings: Any
) -> None:
    deployment = _deployment(world_a)
    client.force_login(world_a.viewer)
    url = reverse(
        "serving-deployment-split", kwargs={"slug": world_a.tenant.slug, "pk": deployment.pk}
    )
    page = client.get(url).content.decode()
    assert "no client keys seen" in page and "Random split" in page
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert 'data-testid="split-unknown"' in client.get(url).content.decode()
    client.logout()
    assert client.get(url).status_code == 302  # to the login page


def test_the_panel_sets_sticky_traffic_for_deployers_only(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    url = reverse(
        "serving-deployment-split", kwargs={"slug": world_a.tenant.slug, "pk": deployment.pk}
    )
    client.force_login(world_a.viewer)
    assert 'data-testid="traffic-settings-form"' not in client.get(url).content.decode()
    assert client.post(url, {"sticky": "on"}).status_code == 403
    deployment.refresh_from_db()
    assert deployment.current_revision.traffic == {}

    client.force_login(world_a.operator)
    page = client.get(url).content.decode()
    assert 'data-testid="traffic-settings-form"' in page and 'data-testid="split-live"' in page
    live = client.get(url + "?live=1").content.decode()
    assert 'data-testid="split-live"' in live and "traffic-settings-form" not in live
    response = client.post(
        url, {"sticky": "on", "client_key_header": "X-Customer", "user_field": ""}
    )
    assert response.status_code == 302
    deployment.refresh_from_db()
    assert deployment.current_revision.traffic == {
        "sticky": True,
        "user_field": False,
        "client_key_header": "x-customer",
    }
    number = deployment.current_revision.number
    shown = client.get(response["Location"]).content.decode()
    assert "Traffic settings saved" in shown
    # A bad header: said on the page, naming the field; no new revision.
    response = client.post(url, {"sticky": "on", "client_key_header": "Authorization"})
    shown = client.get(response["Location"]).content.decode()
    assert "traffic.client_key_header" in shown
    deployment.refresh_from_db()
    assert deployment.current_revision.number == number
