"""Remediation runs: started by a firing alert (`remediation_start`, called where breaches are
handled), advanced step by step (`remediation_advance`, a Celery task per step, with a
countdown for waits), resumed by the health tick when a worker died (`remediation_resume`).

Exactly once: a run's key (deployment + incident + chain) is unique, a step's row (run, index)
is unique, and only the holder of the run's lease advances it. A step that changes desired
state commits its row, its revision and the run's next step in one transaction; a restart
writes its progress after every replica. Each step is told to the incident timeline
(`events.remediation_progressed`).
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from portal.exceptions import PortalError
from serving.deployments.models import Deployment
from serving.ops import events
from serving.ops.models import SlaContract
from serving.ops.remediation import actions
from serving.ops.remediation.conditions import holds
from serving.ops.remediation.models import (
    ACTIVE,
    RemediationRun,
    RemediationStep,
    RunStatus,
    StepStatus,
)
from serving.slo.model import Contract
from serving.slo.remediation import (
    PARAMS,
    Action,
    Chain,
    chains_of,
    single_action_chain,
    step_from_dict,
)
from tenants.models import Tenant

logger = logging.getLogger(__name__)
LEASE_S = 120.0  # a worker renews it after each replica of a restart
STUCK_AFTER_S = 10.0  # a running run nobody holds for this long is resumed by the tick
VERDICT_GIVE_UP_S = 300.0  # a wait no tick can judge (health checks stopped) ends failed
DIRECT_ACTIONS = tuple(a for a in PARAMS if a not in ("rollback", "pause", "notify"))


def _chains(deployment: Deployment, contract_version: int | None) -> tuple[Chain, ...]:
    stored = SlaContract.objects.filter(deployment=deployment, tenant_id=deployment.tenant_id)
    row = (
        stored.filter(version=contract_version) if contract_version else stored.order_by("-version")
    ).first()
    if row is None:
        return ()
    return chains_of(Contract.from_dict(row.document).remediation)


def remediation_start(
    *,
    tenant: Tenant,
    deployment: Deployment,
    group: str,
    alert_kind: str,
    alert_name: str,
    alert_action: str,
    incident_id: int | None,
    contract_version: int | None,
) -> list[int]:
    """Start the chains this alert triggers (the contract's, plus a one-step chain when the
    alert names a remediation action itself), once per incident; returns the new runs' ids.
    Their first step runs after commit."""
    chains = [
        c
        for c in _chains(deployment, contract_version)
        if c.matches(alert_kind=alert_kind, alert_name=alert_name, group=group)
    ]
    if alert_action in DIRECT_ACTIONS:
        chains.append(
            single_action_chain(action=alert_action, alert_kind=alert_kind, alert_name=alert_name)
        )
    started: list[int] = []
    for chain in chains:
        key = f"{deployment.pk}:{incident_id or '-'}:{chain.name}"
        if RemediationRun.objects.filter(tenant=tenant, key=key).exists():
            continue
        try:
            with transaction.atomic():
                run = RemediationRun.objects.create(
                    tenant=tenant,
                    deployment=deployment,
                    key=key,
                    chain=chain.name,
                    group=group,
                    alert=alert_name[:120],
                    incident_id=incident_id,
                    contract_version=contract_version,
                    steps=[step.to_dict() for step in chain.steps],
                )
        except IntegrityError:
            continue  # a concurrent tick started it
        started.append(run.pk)
        events.remediation_progressed(
            run=run,
            step=None,
            message=f"remediation '{chain.name}' started ({len(chain.steps)} steps) "
            f"on {group} for alert '{alert_name}'",
        )
        transaction.on_commit(partial(_enqueue, run.pk))
    return started


def _enqueue(run_id: int, countdown: float = 0) -> None:
    from serving.ops.remediation.tasks import advance_remediation

    advance_remediation.apply_async((run_id,), countdown=max(0.0, countdown))


def _take_lease(run_id: int) -> bool:
    now = timezone.now()
    return bool(
        RemediationRun.objects.filter(pk=run_id, status__in=ACTIVE)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(lease_until=now + timedelta(seconds=LEASE_S))
    )


def _renew(run_id: int) -> None:
    until = timezone.now() + timedelta(seconds=LEASE_S)
    RemediationRun.objects.filter(pk=run_id).update(lease_until=until)


def remediation_advance(*, run_id: int, now: datetime | None = None) -> RemediationRun | None:
    """Run every step of the run that is due, in order, until a wait or the end. `now` is the
    clock waits are judged by (tests move it; the lease always uses the real one)."""
    if not _take_lease(run_id):
        return RemediationRun.objects.filter(pk=run_id).first()  # finished, or someone has it
    try:
        while _step(run_id, now or timezone.now()):
            pass
    finally:
        RemediationRun.objects.filter(pk=run_id).update(lease_until=None)
    return RemediationRun.objects.filter(pk=run_id).first()


def _finish(run: RemediationRun, status: str, message: str) -> None:
    run.status, run.message, run.finished_at = status, message[:2000], timezone.now()
    run.due_at = None
    run.save(update_fields=["status", "message", "finished_at", "due_at"])
    events.remediation_progressed(
        run=run, step=None, message=f"remediation '{run.chain}' {message}"
    )


def _record(
    run: RemediationRun, index: int, kind: str, status: str, message: str, data: Any = None
) -> RemediationStep:
    row, _ = RemediationStep.objects.update_or_create(
        run=run,
        index=index,
        defaults={
            "tenant_id": run.tenant_id,
            "kind": kind,
            "status": status,
            "message": message[:2000],
            "data": data or {},
            "finished_at": None if status == StepStatus.RUNNING else timezone.now(),
        },
    )
    events.remediation_progressed(run=run, step=row, message=f"step {index + 1}: {message}")
    return row


def _step(run_id: int, now: datetime) -> bool:
    """One step (or the part of a wait that is due); True when the next may run at once."""
    rollback_id: int | None = None
    restart: Action | None = None
    with transaction.atomic():
        run = (
            RemediationRun.objects.select_for_update(of=("self",))
            .select_related("tenant", "deployment")
            .get(pk=run_id)
        )
        if run.status not in ACTIVE:
            return False
        if run.next_step >= len(run.steps):
            _finish(run, RunStatus.DONE, "done: every step ran")
            return False
        if run.deployment.deleted_at is not None:
            _finish(run, RunStatus.FAILED, "stopped: the deployment was deleted")
            return False
        index, step = run.next_step, step_from_dict(run.steps[run.next_step])
        if step.action is not None and step.action.action == "restart_replicas":
            restart = step.action
            if not RemediationStep.objects.filter(run=run, index=index).exists():
                _record(run, index, restart.action, StepStatus.RUNNING, "restarting replicas")
        elif step.wait is not None:
            if run.due_at is None:
                run.due_at, run.status = now + timedelta(seconds=step.wait), RunStatus.WAITING
                run.save(update_fields=["due_at", "status"])
                then = f", then {step.then.action}" if step.then else ""
                message = f"wait {step.wait}s; if {step.condition}{then}, else stop"
                _record(run, index, "wait", StepStatus.RUNNING, message)
                transaction.on_commit(lambda: _enqueue(run_id, countdown=step.wait or 0))
                return False
            if now < run.due_at:
                return False
            verdict = holds(run, step.condition, since=run.due_at)
            if verdict is None:  # no health tick has judged the slot since the wait ended
                if now - run.due_at > timedelta(seconds=VERDICT_GIVE_UP_S):
                    _finish(run, RunStatus.FAILED, "stopped: no health tick judged the slot")
                return False
            if not verdict:
                _record(run, index, "wait", StepStatus.DONE, f"{step.condition}: no")
                _finish(run, RunStatus.RECOVERED, f"ended: '{step.condition}' did not hold")
                return False
            outcome = (
                _act(run, step.then)
                if step.then
                else actions.Outcome(f"{step.condition}: yes, going on")
            )
            kind = step.then.action if step.then else "wait"
            message = f"{step.condition}: yes; {outcome.message}" if step.then else outcome.message
        elif step.action is not None:
            outcome = _act(run, step.action)
            kind, message = step.action.action, outcome.message
        else:  # neither (a stored run predating a schema change): nothing safe to do
            _finish(run, RunStatus.FAILED, f"stopped: step {index + 1} is not understood")
            return False
        if restart is None:
            _advance_past(run, index, kind, message, outcome)
            rollback_id = outcome.rollback_id
    if restart is not None:
        _restart(run_id, index, restart)
    if rollback_id is not None:
        from serving.ops.rollbacks import rollback_run_now

        rollback_run_now(rollback_id)
    return True


def _advance_past(
    run: RemediationRun, index: int, kind: str, message: str, outcome: actions.Outcome
) -> None:
    status = (
        StepStatus.FAILED
        if outcome.data.get("error")
        else StepStatus.SKIPPED
        if outcome.skipped
        else StepStatus.DONE
    )
    _record(run, index, kind, status, message, outcome.data)
    run.next_step, run.due_at, run.status = index + 1, None, RunStatus.RUNNING
    run.save(update_fields=["next_step", "due_at", "status"])


def _act(run: RemediationRun, action: Action) -> actions.Outcome:
    """One action of the run's deployment; a refusal (quota, no target, no tiers) is the
    step's outcome, not an error of the run: the chain goes on to its next step."""
    deployment, params = run.deployment, dict(action.params)
    reason = f"remediation '{run.chain}' for alert '{run.alert}'"
    try:
        with transaction.atomic():
            if action.action == "scale_out":
                return actions.scale_out(deployment, params)
            if action.action == "shed_load":
                return actions.shed_load(deployment, params)
            if action.action == "switch_to_fallback":
                return actions.switch_to_fallback(deployment, params)
            if action.action == "rollback":
                return actions.rollback(deployment, reason)
            if action.action == "pause":
                return actions.pause(deployment, reason)
            if action.action == "notify":
                return actions.Outcome(f"notified: {reason}")
            # restart_replicas is a step of its own (_restart); anything else is not known here.
            message = f"{action.action} cannot run here (a stored run from an older contract?)"
            return actions.Outcome(message, data={"error": message})
    except PortalError as exc:
        field = f" ({exc.field})" if getattr(exc, "field", None) else ""
        return actions.Outcome(
            f"{action.action} refused: {exc.message}{field}", data={"error": exc.message}
        )


def _restart(run_id: int, index: int, action: Action) -> None:
    """restart_replicas: long, on the live replicas, so outside the run's row lock (the lease
    keeps other workers off); its progress is saved after each replica."""
    from serving.control.cluster import ClusterConfigError
    from serving.control.replicas import ReplicaKillError
    from serving.control.serve_api import ServeApiError
    from serving.deployments.services import current_revision
    from serving.ops.remediation.restart import RestartTimeout, restart_replicas

    run = RemediationRun.objects.select_related("tenant", "deployment").get(pk=run_id)
    row = RemediationStep.objects.get(run=run, index=index)
    revision = current_revision(deployment=run.deployment)

    def save(progress: dict[str, Any]) -> None:
        RemediationStep.objects.filter(pk=row.pk).update(data=progress)
        _renew(run_id)

    try:
        if revision is None:
            raise RestartTimeout("the deployment has no revision")
        outcome = restart_replicas(
            deployment=run.deployment,
            revision=revision,
            group=run.group,
            params=dict(action.params),
            progress=dict(row.data or {}),
            save=save,
        )
        status = StepStatus.SKIPPED if outcome.skipped else StepStatus.DONE
        message, data = outcome.message, outcome.data
    except (RestartTimeout, ReplicaKillError, ServeApiError, ClusterConfigError) as exc:
        status, message = StepStatus.FAILED, f"restart_replicas failed: {exc}"
        data = {**(RemediationStep.objects.get(pk=row.pk).data or {}), "error": str(exc)[:500]}
    with transaction.atomic():
        run = RemediationRun.objects.select_for_update(of=("self",)).get(pk=run_id)
        if run.status not in ACTIVE or run.next_step != index:
            return
        _record(run, index, action.action, status, message, data)
        run.next_step = index + 1
        run.save(update_fields=["next_step"])


def remediation_due(*, now: datetime | None = None) -> list[int]:
    """Runs to advance: a wait that has ended, or a run nobody holds (its worker died)."""
    now = now or timezone.now()
    stuck = now - timedelta(seconds=STUCK_AFTER_S)
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    return list(
        RemediationRun.objects.filter(free)
        .filter(
            Q(status=RunStatus.WAITING, due_at__lte=now)
            | Q(status=RunStatus.RUNNING, created_at__lt=stuck)
        )
        .values_list("pk", flat=True)[:500]
    )


RESUME_EVERY_S = math.ceil(STUCK_AFTER_S)  # one enqueue per run per STUCK_AFTER_S at most


def remediation_resume(*, r: Any, lock_key: str, every_s: int = RESUME_EVERY_S) -> list[int]:
    """The health tick's sweep: enqueue the due and orphaned runs, each at most once every
    `every_s` seconds (never less than STUCK_AFTER_S: a run counts as stuck only after that
    long, so with a backed-up queue a shorter marker would pile up copies of its task)."""
    every_s = max(every_s, RESUME_EVERY_S)
    resumed = []
    for run_id in remediation_due():
        if r.set(f"{lock_key}:remediate:{run_id}", 1, nx=True, ex=every_s):
            _enqueue(run_id)
            resumed.append(run_id)
    return resumed
