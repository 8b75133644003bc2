"""KV cache lifetime as desired state: `kv_cache` checked field by field (a 400 naming the
field, nothing written), compiled into the version slots' user_config (no restart), a vLLM
slot's prefix caching into its init args and its max age refused; the replica side applies the
policy (serving.dataplane.kv_checks). The engine's part: tests/engine/test_kv_integrity.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from portal.exceptions import PortalError
from serving.control.compile import deployment_apps
from serving.dataplane.kv_checks import policies_of
from serving.deployments import services as deployments
from serving.deployments.models import Deployment
from serving.deployments.specs import desired_state
from serving.engine.kv_cache import CachePolicy
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.serving.test_deployments import _vllm_version

pytestmark = pytest.mark.django_db


def _served(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant")


def _change(world: TenantWorld, **changes: Any) -> Any:
    return deployments.deployment_change(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        deployment=_served(world),
        changes=changes,
        reason="kv cache",
    )


def _apps(world: TenantWorld) -> list[dict[str, Any]]:
    specs, _, _ = desired_state()
    spec = next(s for s in specs if s.deployment_id == _served(world).pk)
    return deployment_apps(spec, {})


def _local_config(world: TenantWorld) -> dict[str, Any]:
    router = _apps(world)[0]["deployments"][0]["user_config"]
    return dict(router["local"])


def test_kv_cache_compiles_into_the_slots_user_config(world_a: TenantWorld) -> None:
    before = _apps(world_a)[0]
    revision = _change(world_a, kv_cache={"prefix_caching": False, "max_age_s": 30})
    assert revision.kv_cache == {"prefix_caching": False, "max_age_s": 30.0}
    config = _local_config(world_a)
    assert config["kv_cache"] == {"prefix_caching": False, "max_age_s": 30.0}
    after = _apps(world_a)[0]
    # Only user_config changed: Serve reconfigures the live replicas, none restarts.
    assert after["args"] == before["args"]
    tenants, default = policies_of(config)
    assert default == CachePolicy(prefix_caching=False, max_age_s=30.0) and tenants == {}
    _change(world_a, kv_cache={})
    assert "kv_cache" not in _local_config(world_a)  # back to the defaults


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("off", "kv_cache"),
        ({"prefix_caching": "no"}, "kv_cache.prefix_caching"),
        ({"prefix_caching": 0}, "kv_cache.prefix_caching"),
        ({"max_age_s": 0}, "kv_cache.max_age_s"),
        ({"max_age_s": 10**9}, "kv_cache.max_age_s"),
        ({"max_age_s": "30"}, "kv_cache.max_age_s"),
        ({"max_age_s": True}, "kv_cache.max_age_s"),
        ({"ttl": 5}, "kv_cache.ttl"),
    ],
)
def test_bad_kv_cache_is_refused_naming_the_field(
    world_a: TenantWorld, value: Any, field: str
) -> None:
    before = _served(world_a).current_revision
    with pytest.raises(PortalError) as caught:
        _change(world_a, kv_cache=value)
    assert caught.value.field == field
    assert _served(world_a).current_revision == before  # nothing written


def test_the_api_answers_400_with_the_field(world_a: TenantWorld) -> None:
    pk = _served(world_a).pk
    client = world_a.client("token")
    url = reverse("deployment-detail", args=[pk])
    response = client.patch(url, {"kv_cache": {"max_age_s": -1}}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["kv_cache.max_age_s"]
    response = client.patch(url, {"kv_cache": {"max_age_s": 45}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["revision"]["kv_cache"] == {"max_age_s": 45.0}


def test_a_vllm_slot_maps_prefix_caching_to_its_init_args_and_refuses_a_max_age(
    world_a: TenantWorld,
) -> None:
    version = _vllm_version(world_a)
    _change(world_a, stable_version=version.pk, engine="vllm")
    with pytest.raises(PortalError) as caught:
        _change(world_a, kv_cache={"max_age_s": 30})
    assert caught.value.field == "kv_cache.max_age_s"
    assert "vLLM" in caught.value.message
    stable = next(a for a in _apps(world_a) if a["name"].endswith(".stable"))
    assert stable["args"]["engine"]["enable_prefix_caching"] is True
    _change(world_a, kv_cache={"prefix_caching": False})
    stable = next(a for a in _apps(world_a) if a["name"].endswith(".stable"))
    # An init arg: Serve rolls the vLLM replicas (each new one before the old one drains).
    assert stable["args"]["engine"]["enable_prefix_caching"] is False
    assert stable["deployments"][0]["user_config"]["kv_cache"] == {"prefix_caching": False}
