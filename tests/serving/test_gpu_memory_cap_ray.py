"""The GPU memory cap per replica on a real local Ray cluster: the platform's cap reaches the
Serve replica through reconcile (user_config), where the engine refuses a request past it with
413 `gpu_memory_cap_exceeded` over HTTP, and serves again once the cap leaves room."""

from __future__ import annotations

import httpx
import pytest
from django.contrib.auth import get_user_model

from serving.engine.memory import CAP_FIELD
from tenants import services as tenant_services
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_serving_ray import PROMPT, _apply, _key, _served

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


def _set_cap(world: TenantWorld, mb: int) -> None:
    staff, _ = get_user_model().objects.get_or_create(
        username="sre@platform.example", defaults={"is_staff": True}
    )
    tenant_services.quota_update(
        tenant=world.tenant, actor=Actor(user=staff), changes={CAP_FIELD: mb}
    )


def test_the_cap_reaches_the_replica_and_a_request_past_it_is_a_413(
    world_a: TenantWorld, ray_cluster: RayCluster
) -> None:
    deployment = _served(world_a)
    key = _key(world_a, deployment)
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    headers = {"authorization": f"Bearer {key}"}
    # Below the tiny model's weights and one step's activations (~24.4 MiB): no room for KV.
    _set_cap(world_a, 24)
    _apply(ray_cluster, ["acme.assistant"])
    with httpx.Client(timeout=30, trust_env=False) as http:
        refused = http.post(url, json=body, headers=headers)
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["code"] == "gpu_memory_cap_exceeded" and CAP_FIELD in error["message"]
        # The platform raises it: the same replica, reconfigured, serves.
        _set_cap(world_a, 64)
        _apply(ray_cluster, ["acme.assistant"])
        answer = http.post(url, json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 4
