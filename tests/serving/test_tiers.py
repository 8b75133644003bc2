"""Degraded tiers as desired state: the `tiers` setting checked field by field, counted against
the quota, compiled into the Serve config; `deployment_switch_tier` pins and releases a tier.
(The router's part on a real cluster: tests/serving/test_tiers_ray.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from django.urls import reverse

from portal.exceptions import PortalError, QuotaExceeded, ValidationFailed
from serving.control.compile import deployment_apps
from serving.deployments import services as deployments
from serving.deployments.models import Deployment
from serving.deployments.specs import desired_state, live_versions
from serving.registry import services as registry
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _served(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant")


def _ready(world: TenantWorld) -> Any:
    return registry.version_validate(tenant=world.tenant, version_id=world.version.pk)


def _set_tiers(world: TenantWorld, tiers: Any) -> Any:
    return deployments.deployment_change(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        deployment=_served(world),
        changes={"tiers": tiers},
        reason="tiers",
    )


def _field(world: TenantWorld, tiers: Any) -> str | None:
    with pytest.raises(PortalError) as caught:
        _set_tiers(world, tiers)
    return caught.value.field


def test_tiers_get_the_seeds_defaults_and_compile_into_the_serve_config(
    world_a: TenantWorld,
) -> None:
    small = _ready(world_a)
    revision = _set_tiers(world_a, {"levels": [{"name": "distilled", "version_id": small.pk}]})
    assert revision.tiers["levels"] == [
        {
            "name": "distilled",
            "version_id": small.pk,
            "enter": 0.2,
            "exit": pytest.approx(0.1),
            "sla_latency_scale": 1.0,
        }
    ]
    assert revision.tiers["dwell_s"] == 30 and revision.tiers["pin"] is None
    with override_settings(RELOAD_DEADLINE_S=12.5):
        specs, _, _ = desired_state()
    spec = next(s for s in specs if s.tenant_slug == "acme")
    assert [name for name, _ in spec.tiers] == ["distilled"]
    assert spec.tiers[0][1].version == f"{small.model.name}:{small.label}"
    assert spec.tier_policy["levels"] == [{"name": "distilled", "enter": 0.2, "exit": 0.1}]
    apps = deployment_apps(spec, {})
    assert [a["name"] for a in apps] == ["acme.assistant", "acme.assistant.distilled"]
    assert apps[1]["deployments"][0]["user_config"]["reload_deadline_s"] == 12.5
    assert small in live_versions()  # its replicas may fetch the tier's weights
    # Removing the tiers removes the application.
    assert _set_tiers(world_a, {}).tiers == {}
    specs, _, _ = desired_state()
    spec = next(s for s in specs if s.tenant_slug == "acme")
    assert spec.tiers == () and len(deployment_apps(spec, {})) == 1


@pytest.mark.parametrize(
    ("tiers", "field"),
    [
        ("fast", "tiers"),
        ({"levels": [], "dwell_s": 1}, "tiers.levels"),
        ({"levels": [{"name": "tiny"}]}, "tiers.levels.0.name"),
        ({"levels": [{"name": "distilled", "version_id": 99999}]}, "tiers.levels.0.version_id"),
        ({"levels": [{"name": "distilled", "version_id": "x"}]}, "tiers.levels.0.version_id"),
        ({"levels": [{"name": "distilled", "VID": 1}]}, "tiers.levels.0.VID"),
        (
            {"levels": [{"name": "distilled", "version_id": 0, "enter": 2}]},
            "tiers.levels.0.version_id",
        ),
        ({"levels": ["x"]}, "tiers.levels.0"),
        ({"levels": [{}, {}, {}]}, "tiers.levels"),
        ({"levels": [], "hack": 1}, "tiers.hack"),
    ],
)
def test_bad_tiers_are_refused_naming_the_field(
    world_a: TenantWorld, tiers: Any, field: str
) -> None:
    assert _field(world_a, tiers) == field


def test_each_bound_of_a_level_and_the_policy_is_checked(world_a: TenantWorld) -> None:
    small = _ready(world_a)
    level = {"name": "distilled", "version_id": small.pk}
    stable = _served(world_a).current_revision.stable_version_id
    cases = [
        ({"levels": [{**level, "enter": 2}]}, "tiers.levels.0.enter"),
        ({"levels": [{**level, "enter": 0.3, "exit": 0.3}]}, "tiers.levels.0.exit"),
        ({"levels": [{**level, "enter": True}]}, "tiers.levels.0.enter"),
        ({"levels": [{**level, "sla_latency_scale": 100}]}, "tiers.levels.0.sla_latency_scale"),
        ({"levels": [{**level, "version_id": stable}]}, "tiers.levels.0.version_id"),
        ({"levels": [level, level]}, "tiers.levels"),
        (
            {"levels": [{**level, "enter": 0.6}, {**level, "name": "proxy", "enter": 0.5}]},
            "tiers.levels.enter",
        ),
        ({"levels": [level], "window": 10**7}, "tiers.window"),
        ({"levels": [level], "reference_requests": 1}, "tiers.reference_requests"),
        ({"levels": [level], "dwell_s": -1}, "tiers.dwell_s"),
        ({"levels": [level], "on_breakers_open": "yes"}, "tiers.on_breakers_open"),
        ({"levels": [level], "pin": "proxy"}, "tiers.pin"),
    ]
    for tiers, field in cases:
        assert _field(world_a, tiers) == field, tiers


def test_a_shared_deployment_declares_no_tiers(world_a: TenantWorld) -> None:
    from serving.deployments.services.tiers import clean_tiers

    small = _ready(world_a)
    spec = {"kv_mode": "shared", "tiers": {"levels": [{"name": "proxy", "version_id": small.pk}]}}
    with pytest.raises(ValidationFailed) as caught:
        clean_tiers(tenant=world_a.tenant, spec=spec)
    assert caught.value.field == "tiers"


def test_tiers_count_against_the_replica_quota(world_a: TenantWorld) -> None:
    small = _ready(world_a)
    Quota.objects.filter(tenant=world_a.tenant).update(max_replicas=1)
    with pytest.raises(QuotaExceeded) as caught:
        _set_tiers(world_a, {"levels": [{"name": "distilled", "version_id": small.pk}]})
    assert caught.value.field == "num_replicas"


def test_switch_tier_pins_until_released(world_a: TenantWorld) -> None:
    deployment = _served(world_a)
    with pytest.raises(ValidationFailed) as caught:
        deployments.deployment_switch_tier(deployment=deployment, tier="proxy", reason="x")
    assert caught.value.field == "tier"  # no tiers declared
    small = _ready(world_a)
    _set_tiers(world_a, {"levels": [{"name": "distilled", "version_id": small.pk}]})
    deployment.refresh_from_db()
    with pytest.raises(ValidationFailed) as caught:
        deployments.deployment_switch_tier(deployment=deployment, tier="proxy", reason="x")
    assert caught.value.field == "tier"  # not a declared level
    pinned = deployments.deployment_switch_tier(
        deployment=deployment, tier="distilled", reason="switch_to_fallback: p95 breach"
    )
    assert pinned.tiers["pin"] == "distilled"
    assert pinned.reason == "tier distilled: switch_to_fallback: p95 breach"
    from tenants.models import AuditEvent

    assert AuditEvent.objects.filter(
        tenant=world_a.tenant, action="deployment.tier_switched"
    ).exists()
    released = deployments.deployment_switch_tier(deployment=deployment, tier=None, reason="ok")
    assert released.tiers["pin"] is None and released.number == pinned.number + 1


def test_the_api_sets_and_shows_tiers_and_refuses_another_tenants_version(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    small = _ready(world_a)
    theirs = _ready(world_b)
    api = world_a.client()
    url = reverse("deployment-detail", args=[_served(world_a).pk])
    response = api.patch(
        url, {"tiers": {"levels": [{"name": "proxy", "version_id": theirs.pk}]}}, format="json"
    )
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["tiers.levels.0.version_id"]
    response = api.patch(
        url, {"tiers": {"levels": [{"name": "proxy", "version_id": small.pk}]}}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["revision"]["tiers"]["levels"][0]["enter"] == 0.5


def test_each_tier_asks_the_cluster_for_its_own_replicas() -> None:
    from serving.deployments.capacity import replica_asks

    spec = {"kv_mode": "dedicated", "num_replicas": 2, "num_cpus": 0.5, "num_gpus": 0.0}
    assert len(replica_asks(spec)) == 2
    tiered = {**spec, "tiers": {"levels": [{"name": "distilled"}, {"name": "proxy"}]}}
    assert len(replica_asks(tiered)) == 6


def test_a_saturation_trigger_is_checked_field_by_field_and_reaches_the_router(
    world_a: TenantWorld,
) -> None:
    small = _ready(world_a)
    level = {"name": "distilled", "version_id": small.pk}
    cases = [
        ({"levels": [level], "saturation": "high"}, "tiers.saturation"),
        ({"levels": [level], "saturation": {"level": "proxy"}}, "tiers.saturation.level"),
        ({"levels": [level], "saturation": {"enter": 0}}, "tiers.saturation.enter"),
        ({"levels": [level], "saturation": {"enter": 2}}, "tiers.saturation.enter"),
        ({"levels": [level], "saturation": {"enter": "x"}}, "tiers.saturation.enter"),
        ({"levels": [level], "saturation": {"enter": 0.8, "exit": 0.8}}, "tiers.saturation.exit"),
        ({"levels": [level], "saturation": {"ongoing": 1}}, "tiers.saturation.ongoing"),
    ]
    for tiers, field in cases:
        assert _field(world_a, tiers) == field, tiers
    revision = _set_tiers(world_a, {"levels": [level], "saturation": {}})
    assert revision.tiers["saturation"] == {
        "level": "distilled",
        "enter": 0.9,
        "exit": pytest.approx(0.7),
    }
    specs, _, _ = desired_state()
    spec = next(s for s in specs if s.tenant_slug == "acme")
    router = deployment_apps(spec, {})[0]["deployments"][0]["user_config"]
    assert router["tiers"]["saturation"] == revision.tiers["saturation"]
    # Without a saturation trigger the router's policy holds none (same bytes as before).
    _set_tiers(world_a, {"levels": [level]})
    specs, _, _ = desired_state()
    spec = next(s for s in specs if s.tenant_slug == "acme")
    assert (
        "saturation" not in deployment_apps(spec, {})[0]["deployments"][0]["user_config"]["tiers"]
    )


def test_saturation_needs_the_built_in_engine_on_the_stable_slot(world_a: TenantWorld) -> None:
    from serving.deployments.services.tiers import clean_tiers

    small = _ready(world_a)
    spec = {
        "engine": {"name": "vllm"},
        "tiers": {
            "levels": [{"name": "distilled", "version_id": small.pk}],
            "saturation": {"enter": 0.9},
        },
    }
    with pytest.raises(ValidationFailed) as caught:
        clean_tiers(tenant=world_a.tenant, spec=spec)
    assert caught.value.field == "tiers.saturation"


def test_the_standby_precision_is_a_deployment_setting_of_every_version_slot(
    world_a: TenantWorld,
) -> None:
    assert _field(world_a, {"standby_precision": "int4"}) == "tiers.standby_precision"
    revision = _set_tiers(world_a, {"standby_precision": "float16"})  # no levels needed
    assert revision.tiers == {"standby_precision": "float16"}
    specs, _, _ = desired_state()
    spec = next(s for s in specs if s.tenant_slug == "acme")
    assert spec.standby_precision == "float16" and spec.tiers == ()
    apps = deployment_apps(spec, {})
    assert apps[0]["deployments"][0]["user_config"]["local"]["standby_precision"] == "float16"
    deployment = _served(world_a)
    with pytest.raises(ValidationFailed) as caught:  # no levels: nothing to pin
        deployments.deployment_switch_tier(deployment=deployment, tier="full", reason="x")
    assert caught.value.field == "tier"
    small = _ready(world_a)
    revision = _set_tiers(
        world_a,
        {"levels": [{"name": "distilled", "version_id": small.pk}], "standby_precision": "float16"},
    )
    specs, _, _ = desired_state()
    spec = next(s for s in specs if s.tenant_slug == "acme")
    apps = deployment_apps(spec, {})
    assert apps[1]["deployments"][0]["user_config"]["standby_precision"] == "float16"
    assert _set_tiers(world_a, {"standby_precision": "same"}).tiers == {}
    specs, _, _ = desired_state()
    spec = next(s for s in specs if s.tenant_slug == "acme")
    assert (
        "standby_precision"
        not in deployment_apps(spec, {})[0]["deployments"][0]["user_config"]["local"]
    )
