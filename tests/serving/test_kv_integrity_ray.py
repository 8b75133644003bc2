"""KV cache lifetime and integrity on real replicas (session Ray cluster): a deployment's
`kv_cache` reaches its live replica without a restart (prefix caching off: no hit across
requests; on again with a max age: hits), the replica's integrity scan is published with its
SLI window and shown as the health page's item, and a corruption of the live pool (a reference
nobody holds, made inside the replica's process by a test-only driver) turns the item bad."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from django.urls import reverse

from serving.deployments import services as deployments
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_serving_ray import _apply, _key, _served

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

APP = "acme.assistant"
PROMPT = "the quick brown fox jumps over the lazy dog " * 8  # several full blocks
DRIVER = Path(__file__).with_name("kv_corrupt_driver.py")


def _snapshot(found: Any, what: str, timeout: float = 30) -> dict[str, Any]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.SLI_KEY_PREFIX}:sli:{APP}:stable"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for raw in client.hgetall(key).values():
            snapshot = json.loads(raw)
            if found(snapshot):
                return dict(snapshot)
        time.sleep(0.3)
    raise AssertionError(f"no replica published {what} within {timeout:.0f} s")


def _ask(http: httpx.Client, url: str, key: str, times: int = 3) -> None:
    for _ in range(times):
        body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        response = http.post(url, json=body, headers={"authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text


def _set_kv_cache(world: TenantWorld, value: dict[str, Any]) -> None:
    deployments.deployment_change(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        deployment=_served(world),
        changes={"kv_cache": value},
        reason="test: kv cache",
    )


def _hits(snapshot: dict[str, Any], tenant: str) -> int:
    return int(snapshot["kv"]["tenants"].get(tenant, {}).get("prefix_hits", 0))


def test_kv_policy_reaches_the_live_replica_and_a_corrupt_pool_shows_on_health(
    world_a: TenantWorld, ray_cluster: RayCluster, client: Any
) -> None:
    tenant = str(world_a.tenant.pk)
    deployment = _served(world_a)
    key = _key(world_a, deployment)
    _set_kv_cache(world_a, {"prefix_caching": False})
    _apply(ray_cluster, [APP])
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    with httpx.Client(timeout=60, trust_env=False) as http:
        _ask(http, url, key)
        off = _snapshot(
            lambda s: (
                s["kv"].get("prefix_caching") is False
                and s["kv"]["tenants"].get(tenant, {}).get("prefix_queries", 0) > 0
                and (s["kv"].get("integrity") or {}).get("passes", 0) >= 1
            ),
            "prefix caching off",
        )
        assert _hits(off, tenant) == 0  # the same prompt three times, never matched
        assert off["kv"]["cached_blocks"] == 0
        assert off["kv"]["integrity"]["ok"] is True and off["kv"]["integrity"]["applies"]

        # On again, with a max age: a user_config change, the same replica process.
        _set_kv_cache(world_a, {"prefix_caching": True, "max_age_s": 600})
        _apply(ray_cluster, [APP])
        _ask(http, url, key)
        on = _snapshot(
            lambda s: s["kv"].get("max_age_s") == 600 and _hits(s, tenant) > 0,
            "prefix hits under a 600 s max age",
        )
        assert on["pid"] == off["pid"] and on["replica"] == off["replica"]
        assert on["kv"]["cached_blocks"] > 0 and on["kv"]["integrity"]["ok"] is True

    client.force_login(world_a.viewer)
    page_url = reverse(
        "serving-deployment-health-live", kwargs={"slug": world_a.tenant.slug, "pk": deployment.pk}
    )
    page = client.get(page_url).content.decode()
    item = page.split('data-testid="kv-integrity"')[1]
    assert item.startswith(' data-state="ok"'), item[:200]

    # A reference nobody holds, written inside the live replica: the next pass finds it.
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": ray_cluster.token,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    done = subprocess.run(
        [sys.executable, str(DRIVER), ray_cluster.target.address, APP],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    block = int(done.stdout.strip().splitlines()[-1])
    bad = _snapshot(lambda s: not s["kv"]["integrity"]["ok"], "a violation")
    integrity = bad["kv"]["integrity"]
    assert integrity["counts"]["refcount"] >= 1 and integrity["violations_total"] >= 1
    assert any(s["block"] == block and s["kind"] == "refcount" for s in integrity["samples"])
    page = client.get(page_url).content.decode()
    item = page.split('data-testid="kv-integrity"')[1]
    assert item.startswith(' data-state="bad"'), item[:300]
    assert 'data-kind="refcount"' in item and f"block {block}" in item
