"""Rollbacks: traffic back on the last good revision, exactly once.

A rollback is a new revision that routes 100% to the target's stable version and drops the
canary. Only the traffic fields change (weights are user_config), so live replicas are
reconfigured, none restarts. `rollback_request` writes one `Rollback` row per episode (key =
deployment + the revision rolled back + the target revision: concurrent triggers and a
re-delivered task find the same row); `rollback_execute` moves it pending -> switching ->
done, each step idempotent, so a worker killed anywhere in between is simply run again.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from portal import tracing
from portal.exceptions import ConflictError
from portal.statelog import state_changed
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentRevision
from serving.ops import events
from serving.ops.models import Rollback, RollbackStatus, Rollout, RolloutStatus
from tenants.actors import SYSTEM, Actor
from tenants.models import Tenant
from tenants.services import audit_record

logger = logging.getLogger(__name__)


def _previous_stable(current: DeploymentRevision) -> DeploymentRevision | None:
    """The newest earlier revision that served another stable version, without a canary."""
    return (
        DeploymentRevision.objects.filter(
            deployment_id=current.deployment_id,
            number__lt=current.number,
            canary_version__isnull=True,
        )
        .exclude(stable_version_id=current.stable_version_id)
        .order_by("-number")
        .first()
    )


def rollback_target(
    deployment: Deployment, current: DeploymentRevision, rollout: Rollout | None = None
) -> DeploymentRevision | None:
    """Where traffic goes back to. With a canary: the revision the canary started from (its
    stable keeps serving). Without: the last good revision when it served another version,
    else the previous stable version ("roll back to previous")."""
    if current.canary_version_id is not None:
        if rollout is not None:
            return rollout.base_revision
        base = (
            DeploymentRevision.objects.filter(
                deployment_id=current.deployment_id,
                number__lt=current.number,
                canary_version__isnull=True,
                stable_version_id=current.stable_version_id,
            )
            .order_by("-number")
            .first()
        )
        return base or current
    good = deployment.last_good_revision
    if good is not None and good.stable_version_id != current.stable_version_id:
        return good
    return _previous_stable(current)


@tracing.traced("rollback.request")
def rollback_request(
    *,
    tenant: Tenant,
    deployment: Deployment,
    trigger: str,
    reason: str,
    actor: Actor = SYSTEM,
    to_revision_id: int | None = None,
    detected_at: datetime | None = None,
    rollout: Rollout | None = None,
    enqueue: bool = True,
) -> tuple[Rollback, bool]:
    """One Rollback per episode; returns it and whether this call created it. Its execution
    is enqueued after commit (`enqueue=False`: the caller runs `rollback_execute` itself, as
    the health tick does to save the queue hop; the stuck-rollback sweep covers a crash)."""
    with transaction.atomic():
        locked = (
            Deployment.objects.select_for_update(of=("self",))
            .select_related("current_revision", "last_good_revision")
            .get(pk=deployment.pk, tenant=tenant)
        )
        current = locked.current_revision
        if locked.deleted_at is not None or current is None:
            raise ConflictError("this deployment is not live.", field="deployment")
        if rollout is None:
            rollout = (
                Rollout.objects.filter(
                    tenant=tenant,
                    deployment=locked,
                    status__in=[
                        RolloutStatus.PROGRESSING,
                        RolloutStatus.PAUSED,
                        RolloutStatus.NEEDS_REVIEW,
                    ],
                )
                .select_related("base_revision")
                .first()
            )
        if to_revision_id is not None:
            target = DeploymentRevision.objects.filter(
                tenant=tenant, deployment=locked, pk=to_revision_id
            ).first()
            if target is None:
                raise ConflictError("no such revision of this deployment.", field="revision")
        else:
            target = rollback_target(locked, current, rollout)
        if target is None:
            raise ConflictError(
                "there is no earlier good revision to roll back to.", field="revision"
            )
        if (
            current.canary_version_id is None
            and target.stable_version_id == current.stable_version_id
        ):
            raise ConflictError(
                f"revision {target.number} serves the version already serving.", field="revision"
            )
        key = f"{locked.pk}:{current.pk}->{target.pk}"
        existing = Rollback.objects.filter(tenant=tenant, key=key).first()
        if existing is not None:
            return existing, False
        try:
            with transaction.atomic():
                rollback = Rollback.objects.create(
                    tenant=tenant,
                    deployment=locked,
                    key=key,
                    trigger=trigger[:20],
                    reason=reason[:2000],
                    from_revision=current,
                    to_revision=target,
                    rollout=rollout,
                    detected_at=detected_at or timezone.now(),
                    created_by_id=actor.user_id,
                )
        except IntegrityError:
            return Rollback.objects.get(tenant=tenant, key=key), False
        audit_record(
            tenant=tenant,
            actor=actor,
            action="rollback.requested",
            obj=rollback,
            after={"from": current.number, "to": target.number, "trigger": trigger},
        )
        if enqueue:
            transaction.on_commit(lambda: _enqueue(rollback.pk))
    return rollback, True


def rollback_run_now(rollback_id: int) -> None:
    """Execute in this process (the health tick, right after it detected the breach); a
    failure hands the rollback to the task, which retries with backoff."""
    try:
        rollback_execute(rollback_id=rollback_id)
    except Exception as exc:  # the Serve API, the database: the task retries
        logger.warning("rollback %s handed to the task after: %s", rollback_id, exc)
        _enqueue(rollback_id)


def _enqueue(rollback_id: int) -> None:
    from serving.ops.tasks import execute_rollback

    execute_rollback.delay(rollback_id)


def _changes(rollback: Rollback, current: DeploymentRevision) -> dict[str, Any]:
    back_from_canary = rollback.from_revision.canary_version_id is not None
    stable = (
        current.stable_version_id if back_from_canary else rollback.to_revision.stable_version_id
    )
    # The stable slot keeps its engine, or gets the one that served the version it goes back to.
    engine = current.engine if back_from_canary else rollback.to_revision.engine
    # The canary's faults (a drill's) leave with the canary; the stable's stay as they are.
    faults = {g: f for g, f in (current.faults or {}).items() if g != "canary"}
    return {
        "stable_version_id": stable,
        "canary_version_id": None,
        "canary_percent": 0,
        "canary_engine": None,
        "engine": engine,
        "faults": faults,
    }


def _apply() -> None:
    """Bring Serve to the new revision now (the reconcile is serialized and idempotent)."""
    from serving.deployments.reconcile import reconcile

    reconcile()


@tracing.traced("rollback")
def rollback_execute(*, rollback_id: int) -> Rollback | None:
    """Run (or resume) one rollback: write the revision once, apply it to Serve, finish."""
    with transaction.atomic():
        rollback = (
            Rollback.objects.select_for_update(of=("self",))
            .select_related("tenant", "deployment", "from_revision", "to_revision")
            .filter(pk=rollback_id)
            .first()
        )
        if rollback is None or rollback.status in (RollbackStatus.DONE, RollbackStatus.FAILED):
            return rollback
        tenant, deployment = rollback.tenant, rollback.deployment
        if rollback.new_revision_id is None:
            if deployment.deleted_at is not None or deployment.current_revision_id is None:
                rollback.status, rollback.error = RollbackStatus.FAILED, "deployment deleted"
                rollback.finished_at = timezone.now()
                rollback.save(update_fields=["status", "error", "finished_at"])
                return rollback
            current = DeploymentRevision.objects.get(pk=deployment.current_revision_id)
            revision = deployments.deployment_change(
                tenant=tenant,
                actor=Actor(system="rollback"),
                deployment=deployment,
                changes=_changes(rollback, current),
                reason=f"rollback to revision {rollback.to_revision.number} ({rollback.trigger})",
                action="deployment.rolled_back",
                reconcile=False,
            )
            rollback.new_revision = revision
            rollback.started_at = rollback.started_at or timezone.now()
            rollback.status = RollbackStatus.SWITCHING
            rollback.save(update_fields=["new_revision", "started_at", "status"])
            if rollback.rollout_id is not None:
                Rollout.objects.filter(pk=rollback.rollout_id).update(
                    status=RolloutStatus.FAILED,
                    finished_at=timezone.now(),
                    message=f"rolled back: {rollback.reason}"[:2000],
                )
            events.rollback_progressed(rollback=rollback, stage="started")
            state_changed(
                "rollback %s of %s/%s started (%s): %s",
                rollback.pk,
                tenant.slug,
                deployment.name,
                rollback.trigger,
                rollback.reason[:200],
            )
    _apply()  # raises ServeApiError: the task retries, the row stays `switching`
    with transaction.atomic():
        rollback = Rollback.objects.select_for_update(of=("self",)).get(pk=rollback_id)
        if rollback.status == RollbackStatus.DONE:
            return rollback
        now = timezone.now()
        rollback.traffic_switched_at = rollback.traffic_switched_at or now
        rollback.finished_at = now
        rollback.status = RollbackStatus.DONE
        rollback.save(update_fields=["traffic_switched_at", "finished_at", "status"])
        events.rollback_progressed(rollback=rollback, stage="finished")
        state_changed("rollback %s done: traffic is back on the earlier revision", rollback.pk)
    return rollback


def rollbacks_stuck(*, older_than_s: float = 10.0) -> list[int]:
    """Rollbacks a dead worker left pending or switching: their task is enqueued again."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    return list(
        Rollback.objects.filter(
            status__in=[RollbackStatus.PENDING, RollbackStatus.SWITCHING], created_at__lt=cutoff
        ).values_list("pk", flat=True)
    )
