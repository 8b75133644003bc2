"""Chaos drills for real: a local Ray cluster, a real Celery worker on the `chaos` queue (and
`default` for reconciles, `health` for ticks), traffic through the Serve proxy.

* An error burst on the canary: a drill incident, the ops loop rolls the canary back, the run
  passes with MTTD and MTTR, traffic ends on stable and the fault is gone.
* The worker killed with SIGKILL while the fault is in: the resume sweep picks the run up on a
  new worker; the fault was written once and reverted once; the run ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from incidents import drills
from incidents.drills.models import DrillRun, DrillStatus
from incidents.drills.tasks import resume_drill_runs
from incidents.models import Incident
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentRevision
from serving.ops.contracts import contract_set
from serving.ops.tasks import health_tick
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_ops_loop import FAST_CONTRACT, _version
from tests.serving.test_ops_ray import Traffic, Worker, wait_running, worker_factory  # noqa: F401

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
CHAOS_QUEUES = "default,health,chaos"


def _serving(world: TenantWorld, cluster: RayCluster, *, canary: bool) -> tuple[Deployment, str]:
    actor = Actor(user=world.owner)
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    Deployment.objects.exclude(pk=deployment.pk).update(deleted_at=deployment.created_at)
    _, key = deployments.inference_key_create(
        tenant=world.tenant, actor=actor, deployment=deployment, name="client"
    )
    contract_set(tenant=world.tenant, actor=actor, deployment=deployment, source=FAST_CONTRACT)
    app = f"{world.tenant.slug}.assistant"
    apps = [app]
    if canary:
        v2 = _version(world, "v2")
        deployments.deployment_set_canary(
            tenant=world.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=30
        )
        apps.append(f"{app}.canary")
    client = cluster.client()
    control.reconcile(target=cluster.target, client=client)
    client.wait_until(apps, timeout=180)
    wait_running(deployment, client)
    return deployment, key


def _until(done: Callable[[], bool], timeout: float, *, tick: bool = True) -> None:
    """Enqueue a health tick every second (as beat does) until `done`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tick:
            health_tick.delay()
        if done():
            return
        time.sleep(1.0)
    raise AssertionError(f"not done within {timeout} s")


def _status(run: DrillRun) -> str:
    run.refresh_from_db()
    return run.status


def test_a_canary_error_burst_drill_is_caught_rolled_back_and_passes(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
) -> None:
    deployment, key = _serving(world_a, ray_cluster, canary=True)
    drill = drills.drill_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        name="canary burst", fault="error_burst", group="canary", traffic_share=0.5,
        duration_s=20, steady_state={"contract": True,
                                     "probes": [{"sli": "error_rate", "max": 0.1}]},
    )  # fmt: skip
    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES)
    worker.start()
    try:
        _until(lambda: sum(traffic.groups.values()) > 20, 60)  # the steady state has data
        run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                               drill=drill)  # fmt: skip
        _until(lambda: _status(run) in (DrillStatus.PASSED, DrillStatus.FAILED,
                                        DrillStatus.ABORTED), 150)  # fmt: skip
        assert run.status == DrillStatus.PASSED, (run.verdict, list(run.events.values_list(
            "kind", "message")))  # fmt: skip
        incident = Incident.objects.get(pk=run.incident_id)
        assert incident.is_drill and incident.drill_run_id == run.pk
        assert incident.rollback_id is not None  # the ops loop acted
        assert run.mttd_s is not None and run.mttd_s <= 15, run.mttd_s
        assert run.mttr_s is not None and run.mttd_s <= run.mttr_s <= 30, run.mttr_s
        assert 0 <= (run.resilience_score or 0) < 100
        deployment.refresh_from_db()
        assert deployment.current_revision.canary_version_id is None
        assert deployment.current_revision.faults == {}
        before = sum(traffic.groups.values())
        _until(lambda: sum(traffic.groups.values()) > before + 30, 30, tick=False)
        assert traffic.last_groups[-30:] == ["stable"] * 30
    finally:
        traffic.close()


def test_a_worker_killed_mid_drill_resumes_and_reverts_once(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
) -> None:
    deployment, key = _serving(world_a, ray_cluster, canary=False)
    drill = drills.drill_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        name="slow stable", fault="latency_spike", parameters={"delay_ms": 200},
        group="stable", traffic_share=1.0, duration_s=20,
        steady_state={"contract": False, "probes": [{"sli": "error_rate", "max": 0.2}]},
    )  # fmt: skip
    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    env = {"DRILL_RESUME_AFTER_S": "3"}
    first = worker_factory(reconcile=True, queues=CHAOS_QUEUES, env=env)
    first.start()
    try:
        _until(lambda: sum(traffic.groups.values()) > 10, 60)
        run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                               drill=drill)  # fmt: skip
        _until(lambda: _status(run) == DrillStatus.OBSERVING, 60)
        first.kill()  # SIGKILL, holding the run's next step
        time.sleep(4)
        run.refresh_from_db()
        assert run.status == DrillStatus.OBSERVING  # nobody stepped it since
        second = worker_factory(reconcile=True, queues=CHAOS_QUEUES, env=env)
        second.start()

        def resumed_and_ended() -> bool:
            resume_drill_runs.delay()  # what beat does every 15 s
            return _status(run) in (DrillStatus.PASSED, DrillStatus.FAILED, DrillStatus.ABORTED)

        _until(resumed_and_ended, 120)
        # The run resumes, detects the spike and ends, injected once and reverted once. (The
        # killed worker may have held the injection's reconcile: the resume sweep applies the
        # desired state again, or the fault would only reach the replicas an hour later.)
        assert run.status == DrillStatus.PASSED, run.verdict
        kinds = list(run.events.values_list("kind", flat=True))
        assert kinds.count("injected") == 1 and kinds.count("reverted") == 1, kinds
        reasons = list(
            DeploymentRevision.objects.filter(deployment=deployment)
            .filter(reason__contains=f"(run {run.pk})")
            .values_list("reason", flat=True)
        )
        assert len(reasons) == 2, reasons  # one injection, one revert
        deployment.refresh_from_db()
        assert deployment.current_revision.faults == {}
        assert traffic.statuses.get(200, 0) > 0
    finally:
        traffic.close()
