"""Chaos drills without Ray: validation that names the field, cron schedules in
django-celery-beat, and a whole run driven step by step: steady state, the fault injected
through a revision (with its TTL), the ops loop's drill incident and rollback (MTTD, MTTR),
the revert, the verdict and the resilience score; aborts by condition and by hand."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django_celery_beat.models import PeriodicTask

from incidents import drills
from incidents.drills import selectors as drill_selectors
from incidents.drills import steady
from incidents.drills.models import ChaosDrill, DrillRun, DrillStatus
from incidents.models import Incident
from portal.exceptions import ConflictError, ValidationFailed
from serving.deployments import services as deploy
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health
from serving.ops.contracts import contract_set
from serving.ops.models import Rollback
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.test_drill_detection import ReportingReplica
from tests.serving.test_ops_loop import FAST_CONTRACT, Replica, _ready, _version, applied  # noqa: F401

pytestmark = pytest.mark.django_db

PROBES = {"contract": True, "probes": [{"sli": "error_rate", "max": 0.05, "weight": 2}]}


def _drill(world: TenantWorld, deployment: Deployment, **extra: Any) -> Any:
    data: dict[str, Any] = {
        "name": "canary errors", "fault": "error_burst", "group": "canary",
        "traffic_share": 0.3, "duration_s": 10, "steady_state": PROBES, **extra,
    }  # fmt: skip
    return drills.drill_create(
        tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment, **data
    )


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"fault": "meteor_strike"}, "fault"),
        ({"parameters": {"share": 0.5}}, "parameters.share"),
        ({"fault": "latency_spike", "parameters": {"delay_ms": 0}}, "parameters.delay_ms"),
        ({"fault": "latency_spike", "parameters": {"distribution": "normal"}},
         "parameters.distribution"),
        ({"steady_state": {"probes": [{"sli": "vibes", "max": 1}]}}, "steady_state.probes[0].sli"),
        ({"steady_state": {"probes": [{"sli": "error_rate"}]}}, "steady_state.probes[0].max"),
        ({"abort_conditions": {"error_rate_above": 2}}, "abort_conditions.error_rate_above"),
        ({"schedule": "every tuesday"}, "schedule"),
        ({"schedule": "61 * * * *"}, "schedule"),
        ({"duration_s": 1}, "duration_s"),
        ({"traffic_share": 0}, "traffic_share"),
        ({"group": "blue"}, "group"),
        ({"revert": "never"}, "revert"),
    ],
)  # fmt: skip
def test_bad_drills_are_refused_naming_the_field(
    world_a: TenantWorld, extra: dict[str, Any], field: str
) -> None:
    deployment = _ready(world_a)
    with pytest.raises(ValidationFailed) as exc:
        _drill(world_a, deployment, **extra)
    assert exc.value.field == field, exc.value.message
    assert not ChaosDrill.objects.exists()  # nothing half-written


def test_a_schedule_is_a_cron_entry_in_celery_beat(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    drill = _drill(world_a, deployment, schedule="30 3 * * 1")
    task = PeriodicTask.objects.get(name=f"drill-{drill.pk}")
    assert task.task == "incidents.start_scheduled_drill" and task.queue == "chaos"
    assert (task.crontab.minute, task.crontab.hour, task.crontab.day_of_week) == ("30", "3", "1")
    actor = Actor(user=world_a.owner)
    drills.drill_update(tenant=world_a.tenant, actor=actor, drill=drill, schedule="0 4 * * *")
    task.refresh_from_db()
    assert task.crontab.hour == "4"
    drills.drill_update(tenant=world_a.tenant, actor=actor, drill=drill, is_active=False)
    assert not PeriodicTask.objects.filter(name=f"drill-{drill.pk}").exists()
    with pytest.raises(ConflictError):
        _drill(world_a, deployment)  # same name


def test_a_canary_error_burst_is_detected_rolled_back_and_scored(
    world_a: TenantWorld,
    applied: list[int],  # noqa: F811 (the fixture, imported above)
    django_capture_on_commit_callbacks: Any,
) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=FAST_CONTRACT)
    v2 = _version(world_a, "v2")
    deploy.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    stable = Replica(deployment, "stable", "s1")
    canary = ReportingReplica(deployment, "canary", "c1")  # its fault report, as in Ray
    drill = _drill(world_a, deployment)
    t0 = time.time()

    def tick(at: float, canary_failed: int = 0) -> None:
        stable.serve(ok=40)
        canary.report = (
            {"drill": str(run.pk), "active": ["error_burst"], "effects_drill": str(run.pk),
             "effects": {"error_burst": canary_failed}}
            if canary_failed else None
        )  # fmt: skip
        canary.serve(ok=10 - canary_failed, failed=canary_failed)
        with django_capture_on_commit_callbacks(execute=True):
            health.tick(now=at)

    tick(t0)
    run = drills.run_start(tenant=world_a.tenant, actor=actor, drill=drill)
    assert drills.run_advance(run.pk, t0 + 0.1) == 0  # -> checking
    assert drills.run_advance(run.pk, t0 + 0.2) == 0  # steady state holds -> injecting
    assert drills.run_advance(run.pk, t0 + 0.3) == drills.STEP_S, DrillRun.objects.get(
        pk=run.pk
    ).verdict
    run.refresh_from_db()
    assert run.status == DrillStatus.OBSERVING and run.injected_at is not None
    deployment.refresh_from_db()
    fault = deployment.current_revision.faults["canary"]
    assert fault["error_burst"] == {"status": 503, "share": 0.3} and fault["drill"] == str(run.pk)
    assert fault["expires_at"] == pytest.approx(t0 + 0.3 + 10 + drills.TTL_GRACE_S, abs=0.01)
    assert run.fault_revision == deployment.current_revision
    # The replicas fail (what the fault does in Ray): the tick opens a drill incident and the
    # ops loop rolls the canary back.
    tick(t0 + 2, canary_failed=4)
    incident = Incident.objects.get(tenant=world_a.tenant, deployment=deployment)
    assert incident.is_drill and incident.drill_run_id == run.pk
    assert incident.dedup_key.startswith(f"drill-{run.pk}:")
    assert Rollback.objects.filter(deployment=deployment).count() == 1
    drills.run_advance(run.pk, t0 + 2.5)
    run.refresh_from_db()
    assert run.deviated and run.incident == incident and run.detected_at is not None
    assert run.effect_at is not None and run.detected_by in ("error_ratio", "contract")
    assert run.mitigated_at is not None and run.mttd_s is not None and run.mttr_s is not None
    assert 0 <= run.mttd_s <= run.mttr_s
    # Stable keeps serving well; the duration runs out; the fault left with the rollback.
    tick(t0 + 8)
    tick(t0 + 10.5)
    assert drills.run_advance(run.pk, t0 + 10.6) == 0  # duration over -> reverting
    assert drills.run_advance(run.pk, t0 + 10.7) == drills.STEP_S  # nothing left to revert
    # The probe window (15 s) still holds the canary's failures: the run waits for recovery.
    assert drills.run_advance(run.pk, t0 + 10.8) == drills.STEP_S
    tick(t0 + 20)
    assert drills.run_advance(run.pk, t0 + 20.1) is None
    run.refresh_from_db()
    assert run.status == DrillStatus.PASSED, run.verdict
    assert run.verdict == "detected and recovered" and run.revert_revision is None
    assert 0 < run.resilience_score < 100  # the probes broke while the fault was in
    kinds = list(run.events.values_list("kind", flat=True))
    for kind in ("scheduled", "checking", "steady_state", "injected", "deviated", "detected",
                 "mitigated", "duration_over", "already_gone", "passed"):  # fmt: skip
        assert kind in kinds, kinds
    with pytest.raises(ConflictError):
        drills.run_stop(tenant=world_a.tenant, actor=actor, run=run)


def test_one_active_run_per_deployment_and_a_stop_reverts(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    actor = Actor(user=world_a.owner)
    drill = _drill(world_a, deployment, group="stable", steady_state={"contract": False,
                   "probes": [{"sli": "error_rate", "max": 0.5}]})  # fmt: skip
    other = _drill(world_a, deployment, name="second", group="stable")
    run = drills.run_start(tenant=world_a.tenant, actor=actor, drill=drill)
    with pytest.raises(ConflictError) as exc:
        drills.run_start(tenant=world_a.tenant, actor=actor, drill=other)
    assert exc.value.field == "deployment"
    now = time.time()
    for step in range(3):
        drills.run_advance(run.pk, now + step)
    deployment.refresh_from_db()
    assert "error_burst" in deployment.current_revision.faults["stable"]
    drills.run_stop(tenant=world_a.tenant, actor=actor, run=run)
    assert drills.run_advance(run.pk, now + 4) == 0  # -> reverting
    drills.run_advance(run.pk, now + 5)  # the revert revision
    deployment.refresh_from_db()
    assert deployment.current_revision.faults == {}
    assert drills.run_advance(run.pk, now + 6) is None
    run.refresh_from_db()
    assert run.status == DrillStatus.ABORTED and run.revert_revision is not None
    assert "stopped by hand" in run.verdict


def test_a_run_whose_steady_state_fails_first_injects_nothing(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    Replica(deployment, "stable", "s1").serve(ok=5, failed=5)
    health.tick(now=time.time())
    drill = _drill(world_a, deployment, group="stable", steady_state={"contract": False,
                   "probes": [{"sli": "error_rate", "max": 0.05}]})  # fmt: skip
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    now = time.time()
    drills.run_advance(run.pk, now)
    assert drills.run_advance(run.pk, now + 0.1) is None
    run.refresh_from_db()
    assert run.status == DrillStatus.ABORTED and "did not hold" in run.verdict
    deployment.refresh_from_db()
    assert deployment.current_revision.faults == {}  # nothing was injected


def test_an_abort_condition_ends_the_run_early(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    replica = Replica(deployment, "stable", "s1")
    replica.serve(ok=10)
    now = time.time()
    health.tick(now=now)
    drill = _drill(world_a, deployment, group="stable", duration_s=300,
                   steady_state={"contract": False, "probes": [{"sli": "error_rate", "max": 1}]},
                   abort_conditions={"error_rate_above": 0.2})  # fmt: skip
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    for step in range(3):
        drills.run_advance(run.pk, now + 0.1 * step)
    replica.serve(ok=5, failed=5)
    health.tick(now=now + 2)
    assert drills.run_advance(run.pk, now + 2.1) == 0  # aborting -> reverting
    drills.run_advance(run.pk, now + 2.2)
    replica.serve(ok=10)
    health.tick(now=now + 20)  # the probe window has only good requests again
    assert drills.run_advance(run.pk, now + 20.1) is None
    run.refresh_from_db()
    assert run.status == DrillStatus.ABORTED and "error rate 25.0% above 20.0%" in run.verdict


def test_runs_nobody_stepped_are_resumed(world_a: TenantWorld) -> None:
    from datetime import timedelta

    from django.utils import timezone

    deployment = _ready(world_a)
    drill = _drill(world_a, deployment)
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    assert drill_selectors.runs_to_resume() == []
    later = timezone.now() + timedelta(seconds=drills.RESUME_AFTER_S + 1)
    assert drill_selectors.runs_to_resume(later) == [run.pk]
    DrillRun.objects.filter(pk=run.pk).update(status=DrillStatus.PASSED)
    assert drill_selectors.runs_to_resume(later) == []


def test_the_resume_sweep_applies_the_desired_state_again(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed mid-run may have held the reconcile of the run's injection: resuming
    steps the run and reconciles again (nothing when no run needs resuming)."""
    from incidents.drills import tasks as drill_tasks
    from serving.deployments import tasks as deployment_tasks

    sent: list[Any] = []
    monkeypatch.setattr(deployment_tasks.reconcile, "delay", lambda: sent.append("reconcile"))
    monkeypatch.setattr(drill_tasks.advance_drill_run, "delay", sent.append)
    deployment = _ready(world_a)
    drill = _drill(world_a, deployment)
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    assert drill_tasks.resume_drill_runs() == 0 and sent == []
    DrillRun.objects.filter(pk=run.pk).update(stepped_at=run.stepped_at - timedelta(hours=1))
    assert drill_tasks.resume_drill_runs() == 1
    assert sent == ["reconcile", run.pk]


@pytest.mark.parametrize("fault", ["gpu_memory_leak", "replica_crash", "replica_hang"])
def test_replica_faults_go_in_with_their_blast_radius(world_a: TenantWorld, fault: str) -> None:
    """Every replica fault's entry passes the data plane's validation (bench/drills.py found
    gpu_memory_leak refused for its replica_share)."""
    deployment = _ready(world_a)
    drill = _drill(world_a, deployment, name=f"{fault} drill", fault=fault, group="stable",
                   replica_share=0.5, steady_state={"contract": False, "probes": [
                       {"sli": "error_rate", "max": 1}]})  # fmt: skip
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    now = time.time()
    for step in range(3):
        drills.run_advance(run.pk, now + step)
    run.refresh_from_db()
    assert run.status == DrillStatus.OBSERVING, run.verdict
    deployment.refresh_from_db()
    assert deployment.current_revision.faults["stable"][fault]["replica_share"] == 0.5


def test_a_late_step_still_sees_a_deviation_that_ended_in_between(world_a: TenantWorld) -> None:
    """A step that comes late (a busy or restarted worker) judges every row since the previous
    step, not only the last PROBE_WINDOW_S seconds (bench/drills.py, replica_hang run 3)."""
    from datetime import UTC, datetime

    from tests.incidents.slis import sample

    deployment = _ready(world_a)
    drill = _drill(world_a, deployment, group="stable", duration_s=300,
                   steady_state={"contract": False, "probes": [{"sli": "error_rate", "max": 0.05}]})  # fmt: skip
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    now = time.time()
    for step in range(4):  # start, check, inject, a first look
        drills.run_advance(run.pk, now + 0.1 * step)
    run.refresh_from_db()
    assert run.status == DrillStatus.OBSERVING and not run.deviated
    # 3 s of half failed requests, ending 5 s after the injection; the next step comes 35 s
    # later, when they are well out of a 15 s window.
    sample(deployment, datetime.fromtimestamp(now + 5, tz=UTC), seconds=3, requests=100,
           errors=50)  # fmt: skip
    late = now + 5 + drills.PROBE_WINDOW_S + 20
    assert drills.measure(deployment.pk, "stable", late)["requests"] == 0
    drills.run_advance(run.pk, late)
    run.refresh_from_db()
    assert run.deviated


def test_an_exhausted_budget_does_not_break_the_steady_state(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget stays exhausted for the contract's window after the slot is healthy again:
    counted, it would fail every later drill of the slot at its first check."""
    deployment = _ready(world_a)
    drill = _drill(world_a, deployment, group="stable", steady_state={"contract": True})
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    budget = {"kind": "budget", "name": "availability", "severity": "ticket"}
    burn = {"kind": "burn", "name": "availability", "severity": "page", "burn_long": 20.0}
    monkeypatch.setattr(steady, "firing_alerts", lambda *args: [budget])
    assert drills.steady_state(run, time.time())[0] is True
    monkeypatch.setattr(steady, "firing_alerts", lambda *args: [budget, burn])
    held, results = drills.steady_state(run, time.time())
    assert held is False and results[0]["value"] == ["availability"]


def test_the_runs_incident_is_the_one_on_its_slot(world_a: TenantWorld) -> None:
    """A canary drill: a stable-slot drill incident of the same run (a probe that failed while
    the fault was in) is not its detection (bench/drills.py saw MTTR 22 s from it)."""
    from datetime import UTC, datetime

    from incidents import services as incident_services

    deployment = _ready(world_a)
    drill = _drill(world_a, deployment)  # the canary's error burst
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    now = time.time()

    def breach(group: str, objective: str, at: float) -> Incident:
        return incident_services.breach_record(
            tenant=world_a.tenant, deployment=deployment, group=group, objective=objective,
            kind="fast", severity="page", action="notify", detail="drill", observed={},
            detected_at=datetime.fromtimestamp(at, tz=UTC), is_drill=True, drill_run_id=run.pk,
        )[1]  # fmt: skip

    breach("stable", "health-probe", now + 1)
    run.refresh_from_db()
    drills.note_detection(run, now + 1.5)
    assert run.incident is None
    canary = breach("canary", "error-spike", now + 3)
    drills.note_detection(run, now + 3.5)
    assert run.incident == canary and run.detected_at.timestamp() == pytest.approx(now + 3)
