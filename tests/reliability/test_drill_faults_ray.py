"""The four active drill faults for real: a local Ray cluster, a real Celery worker on the
`chaos` queue (and `default` for reconciles, `health` for ticks), traffic through the Serve
proxy. Each run is stepped by the worker from start to verdict.

* kv_pollution_probe: the synthetic tenant's replays find 0 of the tenant's blocks while the
  tenant's own repeats hit; afterwards its key is refused again.
* token_starvation: a flood on a deployment with a 16-block KV cache: admission refuses what
  can never fit (429 kv_quota_exceeded), serves the rest; the other tenant's deployment on the
  same cluster answers every request and every drill probe.
* weight_swap_jitter: three hot reloads under traffic, not one failed request, no restart.
* control_plane_delay: the portal's Serve API calls and reconciles take the delay longer while
  clients keep getting answers; the key is gone afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings

from incidents import drills
from incidents.drills import faults as drill_faults
from incidents.drills.models import DrillRun, DrillStatus
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.chaos import control_delay_key
from serving.deployments.models import Deployment, DeploymentStatus
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.test_drill_faults import _actor
from tests.ray_cluster import RayCluster
from tests.reliability.test_drills_ray import CHAOS_QUEUES, _serving, _status, _until
from tests.serving.test_ops_ray import Traffic, Worker, worker_factory  # noqa: F401

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
DONE = (DrillStatus.PASSED, DrillStatus.FAILED, DrillStatus.ABORTED)


def _run(world: TenantWorld, deployment: Deployment, fault: str, **extra: Any) -> DrillRun:
    actor = _actor(world, fault)  # platform faults are run by platform staff
    drill = drills.drill_create(
        tenant=world.tenant, actor=actor, deployment=deployment, name=f"{fault} drill",
        fault=fault, group="stable", duration_s=10, **extra,
    )  # fmt: skip
    return drills.run_start(tenant=world.tenant, actor=actor, drill=drill)


def _ended(run: DrillRun, timeout: float = 60) -> DrillRun:
    _until(lambda: _status(run) in DONE, timeout)
    return run


def _explain(run: DrillRun) -> Any:
    return run.verdict, run.probes, list(run.events.values_list("kind", "message"))


def _pids(cluster: RayCluster, app: str) -> set[int]:
    return {r.pid for r in cluster.client().replicas(app) if r.pid}


def test_a_kv_pollution_probe_finds_no_cross_tenant_hit(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
) -> None:
    deployment, key = _serving(world_a, ray_cluster, canary=False)
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    traffic = Traffic(url, key)
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES)
    worker.start()
    try:
        _until(lambda: sum(traffic.groups.values()) > 10, 60)
        run = _ended(_run(world_a, deployment, "kv_pollution_probe", steady_state={
            "contract": False, "probes": [{"sli": "error_rate", "max": 0.05}]}))  # fmt: skip
    finally:
        traffic.close()
    assert run.status == DrillStatus.PASSED, _explain(run)
    measured = run.probes["fault"]
    assert measured["cross_tenant_hits"] == 0
    assert measured["replays_ok"] >= 4 and measured["replay_queries"] > 0, measured
    assert measured["own_repeat_hits"] > 0 and measured["replicas_checked"] == 1, measured
    # Detected by the probe itself (it could have seen a hit); no cross-tenant hit came.
    assert run.detected_by == "probe" and run.revert_revision is not None
    deployment.refresh_from_db()
    assert deployment.current_revision.faults == {}
    # The revert reached the router: the probe identity's key is refused again.
    probe = {"authorization": f"Bearer {drill_faults.drill_probe_key(run.pk)}"}

    def refused() -> bool:
        answer = httpx.post(url, json={"prompt": "hi", "max_tokens": 1}, headers=probe,
                            timeout=30, trust_env=False)  # fmt: skip
        return answer.status_code == 401

    _until(refused, 20, tick=False)
    assert traffic.statuses.get(200, 0) > 0 and set(traffic.statuses) == {200}, traffic.statuses


def _two_tenants(
    world_a: TenantWorld, world_b: TenantWorld, cluster: RayCluster
) -> tuple[Deployment, Deployment, str]:
    """A's deployment with a 16-block KV cache (256 tokens), B's beside it on the cluster."""
    a = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    b = Deployment.objects.get(tenant=world_b.tenant, name="assistant")
    deployments.deployment_change(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=a,
        changes={"kv_blocks": 16}, reason="a small KV cache: long prompts cannot fit",
    )  # fmt: skip
    _, key_b = deployments.inference_key_create(
        tenant=world_b.tenant, actor=Actor(user=world_b.owner), deployment=b, name="client"
    )
    client = cluster.client()
    control.reconcile(target=cluster.target, client=client)
    client.wait_until(["acme.assistant", "globex.assistant"], timeout=180)
    control.refresh_status(client=client)
    for deployment in (a, b):
        deployment.refresh_from_db()
        assert deployment.status == DeploymentStatus.RUNNING, deployment.status_message
    return a, b, key_b


def test_a_token_flood_stays_the_flooding_tenants_problem(
    world_a: TenantWorld,
    world_b: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
) -> None:
    a, _, key_b = _two_tenants(world_a, world_b, ray_cluster)
    neighbour = Traffic(f"{ray_cluster.serve_url}/globex/assistant/v1/completions", key_b)
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES)
    worker.start()
    try:
        run = _ended(_run(world_a, a, "token_starvation", parameters={
            "concurrency": 4, "prompt_chars": 1000, "max_tokens": 8,
        }, steady_state={"contract": False, "probes": [{"sli": "error_rate", "max": 0.05}]}))  # fmt: skip
    finally:
        neighbour.close()
    assert run.status == DrillStatus.PASSED, _explain(run)
    flood, watch = run.probes["fault"]["flood"], run.probes["fault"]["bystanders"]
    # Admission refused what can never fit the tenant's blocks and served the rest.
    assert flood["refused_quota"] > 0 and flood["ok"] > 0, flood
    assert flood["errors"] == 0 and flood["timeouts"] == 0, flood
    assert run.probes["fault"]["bystander_count"] == 1
    assert watch["probes"] >= 3 and watch["failed"] == 0, watch
    assert neighbour.statuses.get(200, 0) > 0 and set(neighbour.statuses) == {200}, (
        neighbour.statuses
    )


def test_hot_reloads_under_traffic_fail_no_request(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
) -> None:
    deployment, key = _serving(world_a, ray_cluster, canary=False)
    app = f"{world_a.tenant.slug}.assistant"
    pids = _pids(ray_cluster, app)
    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES)
    worker.start()
    try:
        _until(lambda: sum(traffic.groups.values()) > 10, 60)
        run = _ended(_run(world_a, deployment, "weight_swap_jitter",
                          parameters={"reloads": 3, "interval_s": 3},
                          steady_state={"contract": False,
                                        "probes": [{"sli": "error_rate", "max": 0}]}))  # fmt: skip
    finally:
        traffic.close()
    assert run.status == DrillStatus.PASSED, _explain(run)
    measured = run.probes["fault"]
    assert measured["reloads_written"] == 3 and measured["errors"] == 0, measured
    assert measured["requests"] > 0
    assert [a["nonce"] for a in measured["applied"].values()] == [3], measured
    assert all(a["ok"] for a in measured["applied"].values())
    assert _pids(ray_cluster, app) == pids  # reloaded in place, no replica restarted
    assert set(traffic.statuses) == {200}, traffic.statuses


def test_a_control_plane_delay_slows_reconciles_not_inference(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
) -> None:
    deployment, key = _serving(world_a, ray_cluster, canary=False)
    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES)
    worker.start()
    try:
        _until(lambda: sum(traffic.groups.values()) > 10, 60)
        started = time.monotonic()
        run = _ended(_run(world_a, deployment, "control_plane_delay",
                          parameters={"delay_ms": 1500},
                          steady_state={"contract": False,
                                        "probes": [{"sli": "error_rate", "max": 0}]}))  # fmt: skip
        took = time.monotonic() - started
    finally:
        traffic.close()
    assert run.status == DrillStatus.PASSED, _explain(run)
    measured = run.probes["fault"]
    delayed = [c["ms"] for c in measured["api_calls"] if c["when"] == "delayed"]
    assert delayed and min(delayed) >= 1500, measured["api_calls"]
    after = [c["ms"] for c in measured["api_calls"] if c["when"] == "after the revert"]
    assert after and after[0] < 1500, measured["api_calls"]
    # The reconciles the drill asked for went through the delayed client too.
    assert any(r["ms"] >= 1500 for r in measured["reconciles"]), measured["reconciles"]
    assert redis.Redis.from_url(settings.REDIS_URL).get(control_delay_key()) is None
    assert took < 60, took
    assert traffic.statuses.get(200, 0) > 0 and set(traffic.statuses) == {200}, traffic.statuses
