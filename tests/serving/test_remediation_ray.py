"""Remediation on the real Ray cluster: a canary failing half of its requests breaches its fast
rule, its contract's chain scales the deployment out (a real replica joins the canary's
application), and, still breaching after the wait, rolls back (the canary's application
goes). Then `restart_replicas` restarts the stable slot's replicas one by one: each one
replaced by a new replica id before the next goes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment
from serving.ops import health
from serving.ops.contracts import contract_set
from serving.ops.models import Rollback, RollbackStatus
from serving.ops.remediation import services as remediation
from serving.ops.remediation.models import RemediationRun, RemediationStep, RunStatus
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_ops_loop import _version
from tests.serving.test_ops_ray import Traffic, wait_running
from tests.serving.test_remediation import CONTRACT as REMEDIATION_CONTRACT
from tests.serving.test_remediation import SCALE_THEN_ROLLBACK

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.django_db]

# The no-Ray suite's contract and chain, plus a chain for the stable slot.
CONTRACT = REMEDIATION_CONTRACT % SCALE_THEN_ROLLBACK.rstrip() + (
    "    - name: refresh\n"
    "      when: {fast: error-spike, group: stable}\n"
    "      steps:\n"
    "        - {action: restart_replicas, timeout: 90s}\n"
)


def _running(cluster: RayCluster, app: str) -> list[str]:
    return [r.replica_id for r in cluster.client().replicas(app) if r.state == "RUNNING"]


def _until(done: Callable[[], Any], timeout: float, what: str, tick: Callable[[], None]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        tick()
        found = done()
        if found:
            return found
        assert time.monotonic() < deadline, f"not {what} within {timeout:.0f}s"
        time.sleep(1.0)


def test_a_breaching_canary_scales_out_then_rolls_back_and_replicas_restart_one_by_one(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    for name, value in ray_cluster.portal_env().items():
        monkeypatch.setenv(name, value)
    actor = Actor(user=world_a.owner)
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    Deployment.objects.exclude(pk=deployment.pk).update(deleted_at=deployment.created_at)
    _, key = deployments.inference_key_create(
        tenant=world_a.tenant, actor=actor, deployment=deployment, name="client"
    )
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=CONTRACT)
    v2 = _version(world_a, "v2")
    deployments.deployment_change(
        tenant=world_a.tenant, actor=actor, deployment=deployment,
        changes={"canary_version": v2.pk, "canary_percent": 30,
                 "faults": {"canary": {"error_rate": 0.5}}},
        reason="canary v2 at 30% (fails half)",
    )  # fmt: skip
    client = ray_cluster.client()
    app = f"{world_a.tenant.slug}.assistant"
    canary_app = f"{app}.canary"
    control.reconcile(target=ray_cluster.target, client=client)
    client.wait_until([app, canary_app], timeout=180)
    wait_running(deployment, client)
    assert len(_running(ray_cluster, canary_app)) == 1

    def tick() -> None:
        with django_capture_on_commit_callbacks(execute=True):
            health.tick(serve_url=ray_cluster.serve_url)

    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    try:
        started = time.monotonic()
        run = _until(
            lambda: RemediationRun.objects.filter(deployment=deployment, chain="heal").first(),
            60, "breached", tick,
        )  # fmt: skip
        detected_s = time.monotonic() - started
        step = RemediationStep.objects.get(run=run, index=0)
        assert step.kind == "scale_out" and step.status == "done", step.message
        # The new revision (2 replicas a slot) applied: a real replica joins the canary.
        control.reconcile(target=ray_cluster.target, client=client)
        _until(lambda: len(_running(ray_cluster, canary_app)) == 2, 120, "scaled out", tick)
        scaled_s = time.monotonic() - started
        # Still failing after the 10 s wait: the tick resumes the run, which rolls back.
        rollback = _until(
            lambda: Rollback.objects.filter(deployment=deployment).first(), 60, "rolled back",
            tick,
        )  # fmt: skip
        rollback.refresh_from_db()
        assert rollback.status == RollbackStatus.DONE and rollback.trigger == "remediation"
        _until(lambda: canary_app not in client.applications(), 120, "canary gone", tick)
        run.refresh_from_db()
        assert run.status == RunStatus.DONE, run.message
        steps = RemediationStep.objects.filter(run=run).order_by("index")
        assert [(s.kind, s.status) for s in steps] == [("scale_out", "done"), ("rollback", "done")]
        rolled_s = time.monotonic() - started
    finally:
        traffic.close()

    # restart_replicas, one by one: the stable slot (the router's replicas, 2 after scale_out).
    client.wait_until([app], timeout=120)
    before = _until(lambda: _running(ray_cluster, app) if len(_running(ray_cluster, app)) == 2
                    else None, 120, "two stable replicas", lambda: None)  # fmt: skip
    [run_id] = remediation.remediation_start(
        tenant=world_a.tenant, deployment=deployment, group="stable", alert_kind="fast",
        alert_name="error-spike", alert_action="notify", incident_id=None,
        contract_version=None,
    )  # fmt: skip
    restart_started = time.monotonic()
    remediation.remediation_advance(run_id=run_id)
    restart_s = time.monotonic() - restart_started
    run = RemediationRun.objects.get(pk=run_id)
    step = RemediationStep.objects.get(run=run, index=0)
    assert run.status == RunStatus.DONE and step.status == "done", step.message
    restarted = step.data["restarted"]
    assert sorted(restarted) == sorted(before)
    assert not set(restarted.values()) & set(before)  # every replica is a new one
    assert len(set(restarted.values())) == 2
    after = _running(ray_cluster, app)
    assert sorted(after) == sorted(restarted.values()), (after, restarted)
    print(
        f"\nremediation on Ray: breach -> run {detected_s:.1f}s, scaled out {scaled_s:.1f}s, "
        f"rolled back {rolled_s:.1f}s after the first tick; 2 replicas restarted one by one "
        f"in {restart_s:.1f}s"
    )
