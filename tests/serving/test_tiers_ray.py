"""Degraded modes and fast recovery on the real session cluster: drifted prompts move a
deployment's traffic to its distilled tier and, once the drift stops and the dwell time has
passed, back (hysteresis); a rollback is served from the replica's standby copy without reading
the checkpoint from disk; a hot reload that overruns its deadline fails cleanly (the old
weights keep serving), shows on the deployment page and alerts once (a ticket on the slot's
incident), whatever the number of health ticks that see it; a busy stable slot (saturation)
moves traffic to the tier too.

Every wait is on a condition (a published state, a response), bounded by a deadline generous
enough for a loaded 2-core machine; a router's or replica's snapshot left by an earlier test
(they live in Redis for seconds after their replica is gone) is skipped, not tripped over."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from django.test import override_settings
from django.urls import reverse

from incidents.models import BreachKind, SlaBreach
from serving.deployments import services as deployments
from serving.deployments.models import DeploymentStatus
from serving.engine.testing import write_tiny_checkpoint
from serving.ops import health
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.dataplane.test_tiers_standby import drifted, english
from tests.ray_cluster import RayCluster
from tests.serving.test_serving_ray import _apply, _key, _ready_version, _served

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

APP = "acme.assistant"
DWELL_S = 4.0


def _published(key: str, pick: Any, timeout: float = 60) -> Any:
    """The first value `pick` returns (not None) from a replica snapshot under `key`."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        for raw in client.hgetall(f"{settings.SLI_KEY_PREFIX}:{key}").values():
            last = json.loads(raw)
            found = pick(last)
            if found is not None:
                return found
        time.sleep(0.3)
    raise AssertionError(f"nothing published under {key} matched; last: {last}")


def _tier(need: Any) -> Any:
    """The router's published tier state once `need(state)` holds (a snapshot without one, a
    router's from before the tiers or an earlier test's, is skipped)."""

    def pick(snapshot: dict[str, Any]) -> Any:
        state = snapshot.get("tier")
        return state if isinstance(state, dict) and need(state) else None

    return _published(f"router:{APP}", pick)


def _complete(
    http: httpx.Client, url: str, key: str, prompt: str, max_tokens: int = 1
) -> httpx.Response:
    response = http.post(
        url,
        json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        headers={"authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200, response.text
    return response


def _page(world: TenantWorld) -> str:
    deployment = _served(world)
    url = reverse("serving-deployment", args=[world.tenant.slug, deployment.pk])
    response = world.client("owner").get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_drift_moves_traffic_to_the_distilled_tier_and_back_with_hysteresis(
    world_a: TenantWorld, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    deployment = _served(world_a)
    key = _key(world_a, deployment)
    small = _ready_version(world_a, write_tiny_checkpoint(tmp_path / "small", seed=5), "small")
    tiers = {
        "levels": [{"name": "distilled", "version_id": small.pk, "enter": 0.3, "exit": 0.2}],
        "reference_requests": 20,
        "window": 20,
        "dwell_s": DWELL_S,
    }
    deployments.deployment_change(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        deployment=deployment,
        changes={"tiers": tiers},
        reason="declare a distilled tier",
    )
    _apply(ray_cluster, [APP, f"{APP}.distilled"])
    deployment.refresh_from_db()  # RUNNING once the tier's application runs too
    assert deployment.status == DeploymentStatus.RUNNING, deployment.status_message
    rng = random.Random(3)
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    with httpx.Client(timeout=30, trust_env=False) as http:
        # The reference (the first 20), then a window of the same kind of prompts: full tier.
        groups = [_complete(http, url, key, english(rng)).headers["x-ab-group"] for _ in range(40)]
        assert set(groups) == {"stable"}
        # Drifted prompts: σ crosses 0.3 once the window holds enough of them.
        answers = [_complete(http, url, key, drifted(rng)) for _ in range(20)]
        last_drifted = time.time()
        assert answers[-1].headers["x-ab-group"] == "distilled"
        assert answers[-1].headers["x-model-version"] == f"served:{small.label}"
        state = _tier(lambda s: s["tier"] != "full")
        assert state["tier"] == "distilled" and state["reason"] == "drift"
        assert state["drift"]["sigma"] >= 0.3
        page = _page(world_a)
        assert 'data-testid="tier-in-force"><strong>distilled</strong>' in page
        # The drift stops: back to full only after σ stays below 0.2 for the dwell time.
        back = None
        deadline = time.monotonic() + 60
        while back is None and time.monotonic() < deadline:
            response = _complete(http, url, key, english(rng))
            if response.headers["x-ab-group"] == "stable":
                back = time.time()
            time.sleep(0.05)
    assert back is not None, "traffic never came back to the full tier"
    state = _tier(lambda s: s["tier"] == "full")
    moves = [(t["from"], t["to"], t["reason"]) for t in state["transitions"]]
    assert moves == [("full", "distilled", "drift"), ("distilled", "full", "recovered")]
    recovered = state["transitions"][-1]
    assert recovered["at"] - last_drifted >= DWELL_S  # hysteresis: the dwell held it
    assert recovered["sigma"] < 0.2
    assert 0 < state["degraded_s"] <= back - state["transitions"][0]["at"] + 1
    assert "min in the last 60.0 min" in _page(world_a)
    # Saturation: the same tier, now also entered while the stable slot's engine is busy
    # (requests in it over Serve's max_ongoing_requests; 5 % is one request in most shapes).
    deployments.deployment_change(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        deployment=deployment,
        changes={"tiers": {**tiers, "saturation": {"enter": 0.05, "exit": 0.01}}},
        reason="and a saturation trigger",
    )
    _apply(ray_cluster, [APP])

    def busy(n: int) -> httpx.Response:
        with httpx.Client(timeout=60, trust_env=False) as http:
            return _complete(http, url, key, english(random.Random(n)), max_tokens=64)

    with ThreadPoolExecutor(6) as pool:  # each request keeps the engine busy for ~0.1 s
        groups = [r.headers["x-ab-group"] for r in pool.map(busy, range(36))]
    assert "distilled" in groups, groups
    saturated = _tier(lambda s: any(t["reason"] == "saturation" for t in s["transitions"]))
    entered = next(t for t in saturated["transitions"] if t["reason"] == "saturation")
    assert entered["to"] == "distilled" and entered["saturation"] >= 0.05


def _standby(need: Any) -> Any:
    """The stable slot's published standby state, once `need(state)` holds."""

    def pick(window: dict[str, Any]) -> Any:
        state = (window.get("kv") or {}).get("standby") or {}
        return state if need(state) else None

    return _published(f"sli:{APP}:stable", pick)


def test_a_rollback_comes_from_the_standby_copy_and_an_overrunning_reload_fails_cleanly(
    world_a: TenantWorld, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    actor = Actor(user=world_a.owner)
    deployment = _served(world_a)
    key = _key(world_a, deployment)
    v1 = deployment.current_revision.stable_version
    v2 = _ready_version(world_a, write_tiny_checkpoint(tmp_path / "v2", seed=7), "v2")
    v3 = _ready_version(world_a, write_tiny_checkpoint(tmp_path / "v3", seed=9), "v3")
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"

    def move(version: Any, reason: str) -> None:
        deployments.deployment_change(
            tenant=world_a.tenant,
            actor=actor,
            deployment=deployment,
            changes={"stable_version": version.pk},
            reason=reason,
        )
        _apply(ray_cluster, [APP])

    with httpx.Client(timeout=30, trust_env=False) as http:
        _apply(ray_cluster, [APP])
        move(v2, "v2")  # a hot reload from disk; v1 stays in memory as the standby
        assert _complete(http, url, key, "hi").headers["x-model-version"] == "served:v2"
        loaded = _standby(lambda s: s.get("version") == "served:s1")
        assert loaded["disk_loads"] == 2 and loaded["restores"] == 0 and loaded["bytes"] > 0
        move(v1, "roll back to v1")  # the rollback: from memory
        assert _complete(http, url, key, "hi").headers["x-model-version"] == "served:s1"
        after = _standby(lambda s: s.get("restores") == 1)
        assert after["disk_loads"] == 2  # the artifact loader did not run again
        assert after["version"] == "served:v2" and after["last_source"] == "standby"
        with override_settings(RELOAD_DEADLINE_S=0.001):
            move(v3, "v3, with a deadline no load can meet")
        failed = _standby(lambda s: s.get("deadline_failures") == 1)
        assert failed["last_deadline_failure"]["version"] == "served:v3"
        assert "deadline" in failed["last_failed_reload"]["error"]
        # Failed cleanly: the old weights answer, the replica never went down.
        for _ in range(5):
            assert _complete(http, url, key, "hi").headers["x-model-version"] == "served:s1"
    page = _page(world_a)
    assert 'data-testid="reload-failed"' in page and "old weights kept serving" in page
    # The failed reload alerts once, however many health ticks see the replica publish it.
    deployment.refresh_from_db()
    for n in range(3):
        health.tick(now=time.time() + 30 * n)
    alerts = SlaBreach.objects.filter(deployment=deployment, kind=BreachKind.RELOAD)
    assert alerts.count() == 1, list(alerts)
    assert "overran its deadline" in alerts[0].detail and alerts[0].severity == "ticket"
    assert alerts[0].observed["version"].endswith(":v3")
