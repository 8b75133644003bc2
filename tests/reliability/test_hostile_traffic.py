"""Hostile tenants and clients against traffic hygiene: a client cannot choose its group by
crafting client keys (the hash is keyed with a salt it never sees, and X-AB-Group does not
override a sticky key), huge header values are bounded (refused, ignored, or never stored),
the router's per-client record stays bounded, and one tenant's clients never appear on another
tenant's split panel."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse

from portal.exceptions import ValidationFailed
from serving.dataplane.answers import publish_router
from serving.dataplane.guard import Refused
from serving.dataplane.sticky import (
    MAX_CLIENT_KEY,
    SplitTracker,
    TrafficConfig,
    bucket_of,
    client_of,
    requested_group,
    sticky_group,
)
from serving.dataplane.traffic import incoming_trace, parse_b3
from serving.deployments import services as deploy
from serving.deployments.models import Deployment
from serving.deployments.traffic_specs import traffic_fields, traffic_salt_hex
from tenants.actors import Actor
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db
PERCENT = 10.0


def _deployment(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant")


def _config(deployment: Deployment) -> TrafficConfig:
    return TrafficConfig.from_dict(traffic_fields(deployment.pk, {"sticky": True}))


def _guesses(deployment: Deployment) -> list[bytes]:
    """Salts an attacker might try: none, zeros, the ids and names it knows."""
    known = [str(deployment.pk), deployment.name, deployment.serve_app, deployment.tenant.slug]
    return [b"", b"\0" * 32, *(k.encode() for k in known)] + [
        hashlib.sha256(k.encode()).digest() for k in known
    ]


def test_crafted_keys_land_in_the_canary_no_more_often_than_the_percent(
    world_a: TenantWorld,
) -> None:
    deployment = _deployment(world_a)
    config = _config(deployment)
    assert config.sticky and len(config.salt) == 32
    for guess in _guesses(deployment):
        # Keys the attacker predicts to be the canary's under its guessed salt.
        picked = [k for k in (f"k{n}" for n in range(6000)) if bucket_of(guess, k) < PERCENT]
        assert len(picked) > 300
        real = [
            sticky_group(c.bucket, PERCENT)
            for c in (client_of(config, {"x-client-key": k}, {}) for k in picked)
            if c is not None
        ]
        share = real.count("canary") / len(real)
        assert share < 0.2, (guess, share)  # the configured 10%, not the attacker's 100%
    # Nor does X-AB-Group move a keyed sticky client off its bucket's group.
    stable_client = next(
        c
        for c in (client_of(config, {"x-client-key": f"s{n}"}, {}) for n in range(100))
        if c is not None and c.bucket >= PERCENT
    )
    assert requested_group(config, stable_client, PERCENT, "canary") == "stable"


def test_the_salt_is_per_deployment_and_never_shown(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    a, b = _deployment(world_a), _deployment(world_b)
    assert traffic_salt_hex(a.pk) != traffic_salt_hex(b.pk)
    # The same key is two unrelated clients in two tenants: no correlation across tenants.
    ca = client_of(_config(a), {"x-client-key": "shared-user"}, {})
    cb = client_of(_config(b), {"x-client-key": "shared-user"}, {})
    assert ca is not None and cb is not None and ca.id != cb.id
    # Neither the API nor the audit trail carries it.
    deploy.deployment_change(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=a,
        changes={"traffic": {"sticky": True}}, reason="sticky",
    )  # fmt: skip
    response = world_a.client().get(f"/api/v1/deployments/{a.pk}/revisions/")
    assert traffic_salt_hex(a.pk) not in response.content.decode()
    rows = response.json()
    rows = rows["results"] if isinstance(rows, dict) else rows
    assert rows[0]["traffic"] == {"sticky": True}


def test_huge_values_are_bounded(world_a: TenantWorld) -> None:
    deployment = _deployment(world_a)
    config = _config(deployment)
    huge = "k" * 1_000_000
    with pytest.raises(Refused) as refused:
        client_of(config, {"x-client-key": huge}, {})
    assert refused.value.status == 400 and len(refused.value.message) < 200
    with pytest.raises(Refused):
        client_of(config, {}, {"user": huge})
    assert client_of(config, {"x-client-key": "k" * MAX_CLIENT_KEY}, {}) is not None
    # Trace headers: a huge one is malformed, ignored without parsing.
    assert parse_b3(huge) is None
    assert incoming_trace({"traceparent": huge, "b3": huge, "x-b3-traceid": huge}) == (None, "")
    # A setting: the header name is bounded and the error does not echo it.
    with pytest.raises(ValidationFailed) as bad:
        deploy.deployment_change(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
            changes={"traffic": {"client_key_header": "x" * 100_000}}, reason="hostile",
        )  # fmt: skip
    assert bad.value.field == "traffic.client_key_header" and len(bad.value.message) < 200
    with pytest.raises(ValidationFailed) as unknown:
        deploy.deployment_change(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
            changes={"traffic": {"y" * 100_000: True}}, reason="hostile",
        )  # fmt: skip
    assert len(unknown.value.field or "") < 100 and len(unknown.value.message) < 300
    # A flood of distinct keys: the router's record and what it publishes stay bounded.
    tracker = SplitTracker()
    tracker.configure({"canary_percent": PERCENT, "groups": {"stable": {}, "canary": {}},
                       "traffic": traffic_fields(deployment.pk, {"sticky": True})})  # fmt: skip
    for n in range(20_000):
        tracker.observe(tracker.client({"x-client-key": f"flood-{n}"}, {}), "stable")
    snapshot = tracker.snapshot()
    assert snapshot["tracked"] <= 1024 and len(json.dumps(snapshot)) < 20_000


def _publish(deployment: Deployment, keys: list[str]) -> list[str]:
    tracker = SplitTracker()
    tracker.configure(
        {
            "canary_percent": 0,
            "groups": {"stable": {"version": "v"}},
            "traffic": traffic_fields(deployment.pk, {}),
        }
    )
    ids = []
    for key in keys:
        c = tracker.client({"x-client-key": key}, {})
        assert c is not None
        tracker.observe(c, "stable")
        ids.append(c.id)
    snapshot = {"app": deployment.serve_app, "replica": "r1", "split": tracker.snapshot()}

    async def send() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        await publish_router(client, settings.SLI_KEY_PREFIX, snapshot)
        await client.aclose()

    asyncio.run(send())
    return ids


def test_one_tenants_clients_never_appear_on_anothers_panel(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    a, b = _deployment(world_a), _deployment(world_b)
    ids_a = _publish(a, [f"acme-user-{n}" for n in range(10)])
    ids_b = _publish(b, [f"globex-user-{n}" for n in range(3)])

    def panel(world: TenantWorld, deployment: Deployment) -> Any:
        url = reverse(
            "serving-deployment-split", kwargs={"slug": world.tenant.slug, "pk": deployment.pk}
        )
        return client.get(url)

    client.force_login(world_b.owner)
    own = panel(world_b, b).content.decode()
    assert all(i in own for i in ids_b) and not any(i in own for i in ids_a)
    assert "acme-user" not in own
    # B asking for A's deployment under its own tenant, or under A's slug: the same 404.
    assert panel(world_b, a).status_code == 404
    assert panel(world_a, a).status_code == 404
    client.force_login(world_a.viewer)
    page = panel(world_a, a).content.decode()
    assert all(i in page for i in ids_a) and not any(i in page for i in ids_b)
