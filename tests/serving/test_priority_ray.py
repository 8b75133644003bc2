"""Priority classes on a real local Ray cluster: a tenant's batch key floods its deployment
(more requests than the engine's batch holds), and its realtime key's requests pass the flood
through the real router and Serve proxy: they answer before a batch request sent just before
them, while the flood still runs, in a small part of the flood's latency; every flood request
is answered (none starved). It failed until the engine's lock let the replica's event loop in
between two steps (serving.engine.async_engine.CallerFirstLock): before, a realtime answer
waited for the whole flood, whatever the engine's queue order."""

from __future__ import annotations

import json
import statistics
import threading
import time
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings

from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentStatus
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

APP = "acme.assistant"
FLOOD = 40  # the engine runs 16 at once: 24 wait
FLOOD_TOKENS = 480  # the guard allows 512; the model's context is 1024


def _apply(cluster: RayCluster, apps: list[str], timeout: float = 120) -> None:
    client = cluster.client()
    before = max((a.last_deployed_time_s for a in client.applications().values()), default=0)
    control.reconcile(target=cluster.target, client=client)
    client.wait_until(apps, deployed_after=before - 0.001, timeout=timeout)
    control.refresh_status(client=client)


def _tenant_kv(tenant_id: str, need: Any, timeout: float = 60) -> dict[str, Any]:
    """The stable slot's per-tenant KV entry, as its replica publishes it to Redis."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.SLI_KEY_PREFIX}:sli:{APP}:stable"
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while time.monotonic() < deadline:
        seen = [json.loads(raw).get("kv", {}) for raw in client.hgetall(key).values()]
        for kv in seen:
            if need(kv.get("tenants", {}).get(tenant_id, {})):
                return dict(kv["tenants"][tenant_id])
        time.sleep(0.2)
    raise AssertionError(f"no window of {key} matched: {seen}")


def test_a_realtime_keys_requests_pass_a_batch_flood_through_the_router(
    world_a: TenantWorld, ray_cluster: RayCluster
) -> None:
    actor = Actor(user=world_a.owner)
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    _, batch_key = deployments.inference_key_create(
        tenant=world_a.tenant, actor=actor, deployment=deployment, name="nightly",
        priority="batch",
    )  # fmt: skip
    _, realtime_key = deployments.inference_key_create(
        tenant=world_a.tenant, actor=actor, deployment=deployment, name="web"
    )
    # Priority acts in the engine's queue: let more requests into the replica than the engine
    # runs at once (16), or they would wait in Serve's proxy, in arrival order.
    deployments.deployment_change(tenant=world_a.tenant, actor=actor, deployment=deployment,
                                  changes={"max_ongoing_requests": 64}, reason="priority test")  # fmt: skip
    _apply(ray_cluster, [APP])
    deployment.refresh_from_db()
    assert deployment.status == DeploymentStatus.RUNNING, deployment.status_message
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    tenant = str(world_a.tenant.pk)
    done: dict[str, tuple[float, int]] = {}  # name -> (when it returned, status)
    answers: dict[str, str] = {}
    sent: dict[str, float] = {}
    limits = httpx.Limits(max_connections=FLOOD + 8, max_keepalive_connections=FLOOD + 8)

    with httpx.Client(timeout=300, trust_env=False, limits=limits) as http:

        def post(name: str, key: str, max_tokens: int, seed: int) -> None:
            # Greedy on the tiny checkpoint these prompts run long (no early EOS), a real flood.
            river = (0, 2, 3, 4, 5, 6, 7)[seed % 7]
            body = {"prompt": f"Tell me about the river number {river}.",
                    "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
            sent[name] = time.monotonic()
            response = http.post(url, json=body, headers={"authorization": f"Bearer {key}"})
            done[name] = (time.monotonic(), response.status_code)
            answers[name] = response.text[:300]

        def start(name: str, key: str, max_tokens: int, seed: int) -> threading.Thread:
            thread = threading.Thread(target=post, args=(name, key, max_tokens, seed))
            thread.start()
            return thread

        post("warm-up", realtime_key, 1, 0)
        assert done["warm-up"][1] == 200
        flood = [start(f"flood{i}", batch_key, FLOOD_TOKENS, i) for i in range(FLOOD)]
        deadline = time.monotonic() + 30  # every flood request sent, the batch full
        while sum(1 for n in sent if n.startswith("flood")) < FLOOD:
            assert time.monotonic() < deadline, "the flood was never sent"
            time.sleep(0.05)
        time.sleep(0.5)
        late_batch = start("late-batch", batch_key, 1, 1000)
        time.sleep(0.3)  # the late batch request is in the engine's queue before them
        for i in range(3):
            post(f"realtime{i}", realtime_key, 1, 2000 + i)
        flood_left = sum(1 for i in range(FLOOD) if f"flood{i}" not in done)
        for thread in [*flood, late_batch]:
            thread.join(timeout=300)

    assert all(status == 200 for _, status in done.values()), done
    realtime_done = max(done[f"realtime{i}"][0] for i in range(3))
    latency = {name: done[name][0] - sent[name] for name in done}
    flood_median = statistics.median(latency[f"flood{i}"] for i in range(FLOOD))
    # Each realtime request waited a small part of what the flood waited (it took a batch
    # request's place at once), not its turn behind the flood.
    assert max(latency[f"realtime{i}"] for i in range(3)) < 0.25 * flood_median, latency
    # Sent after it, answered before it: the realtime requests passed the waiting batch work
    # (in arrival order the late batch request would have answered first).
    assert realtime_done < done["late-batch"][0]
    assert flood_left > 0  # and they did not wait for the flood to drain
    assert len([n for n in done if n.startswith("flood")]) == FLOOD  # none starved
    # The engine made room for them from the running batch work, and says so.
    _tenant_kv(tenant, lambda kv: kv.get("priority_preemptions", 0) >= 1)
