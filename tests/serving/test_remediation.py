"""Remediation chains without Ray: a breaching slot starts its contract's chain once per
incident, each step runs once and lands on the incident timeline, a wait judges the slot on a
tick newer than itself, and every action stays inside the deployment and the tenant's quota."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from incidents.models import Incident
from serving.deployments import services as deploy
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health, rollbacks
from serving.ops.contracts import contract_set
from serving.ops.models import Rollback, RollbackStatus
from serving.ops.remediation import services as remediation
from serving.ops.remediation.models import RemediationRun, RemediationStep, RunStatus
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import Replica, _ready, _version

pytestmark = pytest.mark.django_db

CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: chat-sla
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
  alerts: []
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 15s
      min_requests: 10
      action: notify
  remediation:
    - name: heal
      when: {fast: error-spike, group: canary}
      steps:
%s
"""


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rollbacks are applied to no Serve here: the revisions each one would apply."""
    seen: list[int] = []

    def apply() -> None:
        seen.append(Deployment.objects.get(name="assistant", tenant__slug="acme").pk)

    monkeypatch.setattr(rollbacks, "_apply", apply)
    return seen


SCALE_THEN_ROLLBACK = """\
        - {action: scale_out, replicas: 1}
        - {wait: 10s, if: still_breaching, then: {action: rollback}}
"""


def _canary_breach(
    world: TenantWorld, steps: str, on_commit: Any, *, failed: int = 6
) -> tuple[Deployment, Replica, float]:
    deployment = _ready(world)
    actor = Actor(user=world.owner)
    contract_set(
        tenant=world.tenant, actor=actor, deployment=deployment, source=CONTRACT % steps.rstrip()
    )
    v2 = _version(world, "v2")
    deploy.deployment_set_canary(
        tenant=world.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    canary = Replica(deployment, "canary", "c1")
    Replica(deployment, "stable", "s1").serve(ok=80)
    canary.serve(ok=20 - failed, failed=failed)
    now = time.time()
    with on_commit(execute=True):
        health.tick(now=now)
    return deployment, canary, now


def _timeline(deployment: Deployment) -> list[str]:
    incident = Incident.objects.get(deployment=deployment)
    return list(
        incident.events.filter(kind="remediation")
        .order_by("at", "pk")
        .values_list("message", flat=True)
    )


def test_scale_out_then_rollback_when_still_breaching_after_the_wait(
    world_a: TenantWorld,
    world_b: TenantWorld,
    applied: list[int],
    django_capture_on_commit_callbacks: Any,
    django_assert_max_num_queries: Any,
) -> None:
    deployment, canary, now = _canary_breach(
        world_a, SCALE_THEN_ROLLBACK, django_capture_on_commit_callbacks
    )
    run = RemediationRun.objects.get(deployment=deployment)
    assert run.chain == "heal" and run.group == "canary" and run.alert == "error-spike"
    assert run.status == RunStatus.WAITING and run.next_step == 1
    deployment.refresh_from_db()
    assert deployment.current_revision.num_replicas == 2  # scale_out: 1 -> 2
    assert not Rollback.objects.filter(deployment=deployment).exists()
    incident = Incident.objects.get(deployment=deployment)
    assert run.incident_id == incident.pk
    # Before the wait ends nothing happens, whoever asks.
    remediation.remediation_advance(run_id=run.pk)
    assert RemediationRun.objects.get(pk=run.pk).next_step == 1
    # A tick after the wait still sees the canary fail: the rollback runs, once.
    canary.serve(ok=2, failed=8)
    run.refresh_from_db()
    due = run.due_at
    with django_capture_on_commit_callbacks(execute=True):
        health.tick(now=due.timestamp() + 1)
        remediation.remediation_advance(run_id=run.pk, now=due + timedelta(seconds=1))
    run.refresh_from_db()
    assert run.status == RunStatus.DONE, run.message
    rollback = Rollback.objects.get(deployment=deployment)
    assert rollback.status == RollbackStatus.DONE and rollback.trigger == "remediation"
    incident.refresh_from_db()
    assert incident.rollback == rollback and incident.status == "mitigated"
    steps = list(RemediationStep.objects.filter(run=run).values_list("index", "kind", "status"))
    assert steps == [(0, "scale_out", "done"), (1, "rollback", "done")]
    messages = _timeline(deployment)
    assert messages[0].startswith("remediation 'heal' started (2 steps) on canary")
    assert any("scaled out from 1 to 2 replicas" in m for m in messages)
    assert any(m.startswith("step 2: still_breaching: yes; rollback to revision") for m in messages)
    assert messages[-1] == "remediation 'heal' done: every step ran"
    # The incident page shows the run step by step on its timeline.
    page = world_a.client("owner").get(f"/t/{world_a.tenant.slug}/incidents/{incident.pk}/")
    html = page.content.decode()
    assert page.status_code == 200 and html.count('data-kind="remediation"') == len(messages)
    assert "scaled out from 1 to 2 replicas" in html and "Remediation step" in html
    # The API lists the run with its steps, in a fixed number of queries; no one else's.
    url = f"/api/v1/deployments/{deployment.pk}/remediation/"
    with django_assert_max_num_queries(12):
        answer = world_a.client().get(url)
    assert answer.status_code == 200, answer.content
    [shown] = answer.json()
    assert shown["chain"] == "heal" and shown["status"] == "done"
    assert [(s["kind"], s["status"]) for s in shown["step_rows"]] == [
        ("scale_out", "done"),
        ("rollback", "done"),
    ]
    assert shown["steps"][1] == {
        "wait": "10s",
        "if": "still_breaching",
        "then": {"action": "rollback"},
    }
    assert world_b.client().get(url).status_code == 404
    # Exactly once: the run again, the same breach again, another start for the incident.
    remediation.remediation_advance(run_id=run.pk, now=due + timedelta(seconds=60))
    again = remediation.remediation_start(
        tenant=world_a.tenant, deployment=deployment, group="canary", alert_kind="fast",
        alert_name="error-spike", alert_action="notify", incident_id=incident.pk,
        contract_version=run.contract_version,
    )  # fmt: skip
    assert again == []
    assert RemediationRun.objects.filter(deployment=deployment).count() == 1
    assert Rollback.objects.filter(deployment=deployment).count() == 1
    assert RemediationStep.objects.filter(run=run).count() == 2
    assert len(_timeline(deployment)) == len(messages)


def test_a_slot_that_recovered_during_the_wait_ends_the_chain(
    world_a: TenantWorld, applied: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    deployment, canary, now = _canary_breach(
        world_a, SCALE_THEN_ROLLBACK, django_capture_on_commit_callbacks
    )
    run = RemediationRun.objects.get(deployment=deployment)
    # The wait is judged on a tick newer than its end: none yet, so no verdict.
    remediation.remediation_advance(run_id=run.pk, now=run.due_at + timedelta(seconds=1))
    assert RemediationRun.objects.get(pk=run.pk).status == RunStatus.WAITING
    canary.serve(ok=400)  # the errors fade out of the 15 s window
    with django_capture_on_commit_callbacks(execute=True):
        health.tick(now=run.due_at.timestamp() + 20)
        remediation.remediation_advance(run_id=run.pk, now=run.due_at + timedelta(seconds=1))
    run.refresh_from_db()
    assert run.status == RunStatus.RECOVERED and "did not hold" in run.message
    assert not Rollback.objects.filter(deployment=deployment).exists()
    assert _timeline(deployment)[-1] == "remediation 'heal' ended: 'still_breaching' did not hold"


def test_scale_out_stops_at_the_quota_and_says_so(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    used = Deployment.objects.filter(tenant=world_a.tenant, deleted_at__isnull=True).count()
    Quota.objects.filter(tenant=world_a.tenant).update(max_replicas=used + 2)
    deployment, _, _ = _canary_breach(
        world_a, "        - {action: scale_out, replicas: 4}", django_capture_on_commit_callbacks
    )
    run = RemediationRun.objects.get(deployment=deployment)
    step = RemediationStep.objects.get(run=run, index=0)
    deployment.refresh_from_db()
    revision = deployment.current_revision
    # Two slots (stable + canary) of N replicas each must fit the quota: N stays 1.
    assert revision.num_replicas == 1, step.message
    assert step.status == "skipped" and "no replica added" in step.message
    assert "quota" in step.message


def test_shed_load_only_lowers_and_switch_to_fallback_uses_the_tenants_version(
    world_a: TenantWorld, world_b: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    steps = """\
        - {action: shed_load, canary_percent: 5, max_tokens: 64, max_ongoing_requests: 64}
        - {action: switch_to_fallback, tier: distilled}
        - {action: switch_to_fallback, version: %d}
"""
    foreign = _version(world_b, "theirs")
    deployment, _, _ = _canary_breach(
        world_a, steps % foreign.pk, django_capture_on_commit_callbacks
    )
    run = RemediationRun.objects.get(deployment=deployment)
    assert run.status == RunStatus.DONE
    rows = {r.index: r for r in RemediationStep.objects.filter(run=run)}
    assert rows[0].status == "done"
    assert "canary weight 20% -> 5%" in rows[0].message
    assert "guard max_tokens" in rows[0].message
    assert "max_ongoing_requests" not in rows[0].message  # 16 already below 64: never raised
    current = Deployment.objects.get(pk=deployment.pk).current_revision
    assert current.canary_percent == 5 and current.guard["max_tokens"] == 64
    assert current.max_ongoing_requests == 16
    assert rows[1].status == "failed" and "declares no tiers" in rows[1].message
    # Another tenant's version cannot be a fallback: refused, nothing changes.
    assert rows[2].status == "failed", rows[2].message
    assert Deployment.objects.get(pk=deployment.pk).current_revision == current
    other = Deployment.objects.get(tenant=world_b.tenant, name="assistant")
    assert other.revisions.count() == 1


def test_switch_to_fallback_serves_the_declared_version(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    fallback = _version(world_a, "small")
    deployment, _, _ = _canary_breach(
        world_a,
        f"        - {{action: switch_to_fallback, version: {fallback.pk}}}",
        django_capture_on_commit_callbacks,
    )
    step = RemediationStep.objects.get(run__deployment=deployment, index=0)
    assert step.status == "done", step.message
    current = Deployment.objects.get(pk=deployment.pk).current_revision
    assert current.stable_version_id == fallback.pk and current.canary_version_id is None


def test_an_alert_naming_a_remediation_action_runs_it_once(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    deployment = _ready(world_a)
    source = (CONTRACT % "        - {action: notify}").replace(
        "      action: notify\n  remediation", "      action: scale_out\n  remediation"
    )
    contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        source=source,
    )  # fmt: skip
    stable = Replica(deployment, "stable", "s1")
    stable.serve(ok=10, failed=10)
    now = time.time()
    reports = []
    for offset in (0, 2):
        with django_capture_on_commit_callbacks(execute=True):
            reports.append(health.tick(now=now + offset))
        stable.serve(ok=5, failed=5)
    assert all(r["firing"] for r in reports), reports
    [run] = RemediationRun.objects.filter(deployment=deployment)
    assert run.chain == "error-spike-scale_out" and run.status == RunStatus.DONE
    assert Deployment.objects.get(pk=deployment.pk).current_revision.num_replicas == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_advances_run_each_step_once(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        source=(CONTRACT % "        - {action: scale_out}").replace(", group: canary", ""),
    )  # fmt: skip
    [run_id] = remediation.remediation_start(
        tenant=world_a.tenant, deployment=deployment, group="stable", alert_kind="fast",
        alert_name="error-spike", alert_action="notify", incident_id=None, contract_version=None,
    )  # fmt: skip
    barrier = threading.Barrier(3)

    def advance() -> None:
        try:
            barrier.wait()
            remediation.remediation_advance(run_id=run_id)
        finally:
            connection.close()

    threads = [threading.Thread(target=advance) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run = RemediationRun.objects.get(pk=run_id)
    assert run.status == RunStatus.DONE
    assert RemediationStep.objects.filter(run=run).count() == 1
    assert Deployment.objects.get(pk=deployment.pk).current_revision.num_replicas == 2


def test_the_tick_resumes_an_orphaned_run(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        source=(CONTRACT % "        - {action: scale_out}").replace(", group: canary", ""),
    )  # fmt: skip
    # Started, then its worker died before the first step (nothing ran after commit).
    [run_id] = remediation.remediation_start(
        tenant=world_a.tenant, deployment=deployment, group="stable", alert_kind="fast",
        alert_name="error-spike", alert_action="notify", incident_id=None, contract_version=None,
    )  # fmt: skip
    RemediationRun.objects.filter(pk=run_id).update(
        created_at=RemediationRun.objects.get(pk=run_id).created_at - timedelta(seconds=60)
    )
    assert remediation.remediation_due() == [run_id]
    health.tick(now=time.time())
    run = RemediationRun.objects.get(pk=run_id)
    assert run.status == RunStatus.DONE and remediation.remediation_due() == []


def test_switch_to_fallback_pins_the_first_declared_tier(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    distilled = _version(world_a, "distilled")
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    deploy.deployment_change(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        changes={"tiers": {"levels": [{"name": "distilled", "version_id": distilled.pk}]}},
        reason="declare a degraded tier",
    )  # fmt: skip
    deployment, _, _ = _canary_breach(
        world_a, "        - {action: switch_to_fallback}", django_capture_on_commit_callbacks
    )
    step = RemediationStep.objects.get(run__deployment=deployment, index=0)
    assert step.status == "done" and "distilled tier" in step.message, step.message
    current = Deployment.objects.get(pk=deployment.pk).current_revision
    assert current.tiers["pin"] == "distilled"


def test_a_wait_no_tick_can_judge_gives_up_instead_of_waiting_forever(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        source=(CONTRACT % SCALE_THEN_ROLLBACK).replace(", group: canary", ""),
    )  # fmt: skip
    [run_id] = remediation.remediation_start(
        tenant=world_a.tenant, deployment=deployment, group="stable", alert_kind="fast",
        alert_name="error-spike", alert_action="notify", incident_id=None, contract_version=None,
    )  # fmt: skip
    run = remediation.remediation_advance(run_id=run_id)
    assert run is not None and run.status == RunStatus.WAITING and run.due_at is not None
    due = run.due_at
    run = remediation.remediation_advance(run_id=run_id, now=due + timedelta(seconds=30))
    assert run is not None and run.status == RunStatus.WAITING  # no tick yet: no verdict
    run = remediation.remediation_advance(run_id=run_id, now=due + timedelta(seconds=301))
    assert run is not None and run.status == RunStatus.FAILED
    assert run.message == "stopped: no health tick judged the slot"
    assert not Rollback.objects.filter(deployment=deployment).exists()


def test_a_stored_then_action_that_cannot_run_inline_fails_instead_of_notifying(
    world_a: TenantWorld,
) -> None:
    """A run stored before `then: restart_replicas` was refused (it needs a step of its own)
    must say its step failed, not pretend it notified."""
    deployment = _ready(world_a)
    run = RemediationRun.objects.create(
        tenant=world_a.tenant, deployment=deployment, key=f"{deployment.pk}:-:old", chain="old",
        group="stable", alert="error-spike",
        steps=[{"wait": "10s", "if": "always", "then": {"action": "restart_replicas"}}],
    )  # fmt: skip
    run = remediation.remediation_advance(run_id=run.pk)
    assert run is not None and run.status == RunStatus.WAITING and run.due_at is not None
    run = remediation.remediation_advance(run_id=run.pk, now=run.due_at + timedelta(seconds=1))
    step = RemediationStep.objects.get(run=run, index=0)
    assert step.status == "failed" and "cannot run here" in step.message, step.message
    assert "notified" not in step.message


def test_the_api_schema_describes_the_remediation_runs_and_the_rollout_policy() -> None:
    """Each route keeps its own schema (the runs' list; the policy's body and answer)."""
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    runs = next(v for k, v in paths.items() if k.endswith("/remediation/"))
    policy = next(v for k, v in paths.items() if k.endswith("/rollout-policy/"))
    assert "RemediationRun" in str(runs["get"]["responses"]["200"])
    assert "requestBody" not in runs["get"]
    assert "Policy" in str(policy["put"]["requestBody"]) and "Policy" in str(policy["get"])


def test_a_stuck_run_is_enqueued_at_most_once_per_stuck_after(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backed-up queue: the run stays stuck, ticks every second; one task per STUCK_AFTER_S."""
    from serving.ops.health.state import health_keys, health_redis

    monkeypatch.setattr(remediation, "remediation_due", lambda: [4242])
    sent: list[int] = []
    monkeypatch.setattr(remediation, "_enqueue", lambda run_id, countdown=0: sent.append(run_id))
    r, key = health_redis(), health_keys()["lock"]
    r.delete(f"{key}:remediate:4242")
    assert remediation.remediation_resume(r=r, lock_key=key) == [4242]
    assert remediation.remediation_resume(r=r, lock_key=key, every_s=2) == []
    ttl = r.ttl(f"{key}:remediate:4242")
    assert ttl >= remediation.STUCK_AFTER_S - 1 and sent == [4242]
    r.delete(f"{key}:remediate:4242")
