"""Drills (create, update, delete, their cron entries in django-celery-beat) and runs (start,
stop). The reads of runs (the active one, the ones to resume) are incidents.drills.selectors."""

from __future__ import annotations

import json
from typing import Any

from django.db import IntegrityError, transaction

from incidents.drills import faults as drill_faults
from incidents.drills import policy, replay
from incidents.drills.base import record_event
from incidents.drills.catalogue import (
    check_abort,
    check_parameters,
    check_schedule,
    check_steady_state,
)
from incidents.drills.models import (
    ACTIVE_STATUSES,
    ChaosDrill,
    DrillRun,
    RevertStrategy,
)
from portal.exceptions import ConflictError, ValidationFailed
from serving.deployments.models import Deployment
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

DRILL_FIELDS = (
    "name",
    "description",
    "fault",
    "parameters",
    "group",
    "replica_share",
    "traffic_share",
    "duration_s",
    "steady_state",
    "abort_conditions",
    "schedule",
    "revert",
    "is_active",
    "replay_prompts",
)


def _apply(drill: ChaosDrill, data: dict[str, Any]) -> None:
    unknown = set(data) - set(DRILL_FIELDS)
    if unknown:
        raise ValidationFailed("unknown field.", field=sorted(unknown)[0])
    for name, value in data.items():
        setattr(drill, name, value)
    drill.parameters = check_parameters(drill.fault, drill.parameters)
    if drill.group not in ("stable", "canary"):
        raise ValidationFailed("stable or canary.", field="group")
    drill.steady_state = check_steady_state(drill.steady_state)
    drill.abort_conditions = check_abort(drill.abort_conditions)
    drill.schedule = check_schedule(drill.schedule)
    if drill.revert not in RevertStrategy.values:
        raise ValidationFailed(f"one of {', '.join(RevertStrategy.values)}.", field="revert")
    from portal.validation import clean_or_fail

    clean_or_fail(drill, exclude=["tenant", "deployment", "created_by", "periodic_task"])
    drill_faults.of(drill.fault).check(drill)
    replay.check(drill)
    policy.check_size(drill)


def drill_create(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, **data: Any
) -> ChaosDrill:
    if deployment.tenant_id != tenant.pk or deployment.deleted_at is not None:
        raise ValidationFailed("no such deployment in this tenant.", field="deployment")
    drill = ChaosDrill(tenant=tenant, deployment=deployment, created_by_id=actor.user_id)
    _apply(drill, data)
    policy.check_allowed(actor=actor, drill=drill)
    with transaction.atomic():
        policy.check_drill_count(tenant)
        if ChaosDrill.objects.filter(tenant=tenant, name=drill.name).exists():
            raise ConflictError("a drill with this name exists.", field="name")
        drill.save()
        _sync_schedule(drill)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="drill.created",
            obj=drill,
            after=_drill_snapshot(drill),
        )
    return drill


def drill_update(*, tenant: Tenant, actor: Actor, drill: ChaosDrill, **data: Any) -> ChaosDrill:
    with transaction.atomic():
        locked = ChaosDrill.objects.select_for_update().get(tenant=tenant, pk=drill.pk)
        before = _drill_snapshot(locked)
        _apply(locked, data)
        policy.check_allowed(actor=actor, drill=locked)
        if (
            "name" in data
            and ChaosDrill.objects.filter(tenant=tenant, name=locked.name)
            .exclude(pk=locked.pk)
            .exists()
        ):
            raise ConflictError("a drill with this name exists.", field="name")
        locked.save()
        _sync_schedule(locked)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="drill.changed",
            obj=locked,
            before=before,
            after=_drill_snapshot(locked),
        )
    return locked


def drill_delete(*, tenant: Tenant, actor: Actor, drill: ChaosDrill) -> None:
    with transaction.atomic():
        locked = ChaosDrill.objects.select_for_update().get(tenant=tenant, pk=drill.pk)
        if DrillRun.objects.filter(drill=locked, status__in=ACTIVE_STATUSES).exists():
            raise ConflictError("a run of this drill is in progress: stop it first.")
        if locked.periodic_task is not None:
            locked.periodic_task.delete()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="drill.deleted",
            obj=locked,
            before=_drill_snapshot(locked),
        )
        locked.delete()


def _drill_snapshot(drill: ChaosDrill) -> dict[str, Any]:
    return {name: getattr(drill, name) for name in DRILL_FIELDS}


def _sync_schedule(drill: ChaosDrill) -> None:
    """The drill's cron entry in django-celery-beat: created, changed or removed with it."""
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    if not drill.schedule or not drill.is_active:
        if drill.periodic_task is not None:
            task = drill.periodic_task
            drill.periodic_task = None
            drill.save(update_fields=["periodic_task"])
            task.delete()
        return
    minute, hour, day_of_month, month_of_year, day_of_week = drill.schedule.split(" ")
    cron, _ = CrontabSchedule.objects.get_or_create(
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
        timezone="UTC",
    )
    name = f"drill-{drill.pk}"
    task, _ = PeriodicTask.objects.update_or_create(
        name=name,
        defaults={
            "task": "incidents.start_scheduled_drill",
            "crontab": cron,
            "interval": None,
            "args": json.dumps([drill.pk]),
            "queue": "chaos",
            "enabled": True,
        },
    )
    if drill.periodic_task_id != task.pk:
        drill.periodic_task = task
        drill.save(update_fields=["periodic_task"])


# --- runs -----------------------------------------------------------------------------------


def run_start(
    *, tenant: Tenant, actor: Actor, drill: ChaosDrill, trigger: str = "manual"
) -> DrillRun:
    """A new run, advanced by the chaos queue from the next commit on. One active run per
    deployment: a second is refused (ConflictError); so is one beyond the tenant's
    concurrent-run quota, one by a suspended tenant, and one the drill policy no longer
    allows (the deployment moved to a shared pool, or shrank below the fault's size)."""
    from incidents.drills.tasks import advance_drill_run

    deployment = drill.deployment
    if deployment.deleted_at is not None:
        raise ConflictError("the deployment was deleted.", field="deployment")
    policy.check_allowed(actor=actor, drill=drill)
    policy.check_size(drill)
    run = DrillRun(
        tenant=tenant,
        drill=drill,
        deployment=deployment,
        fault=drill.fault,
        trigger=trigger,
        snapshot=_drill_snapshot(drill),
    )
    try:
        with transaction.atomic():
            policy.check_can_start(tenant=tenant, deployment_id=deployment.pk)
            run.save()
            record_event(run, "scheduled", f"{trigger} run of {drill.name} by {actor.label}")
            audit_record(tenant=tenant, actor=actor, action="drill.run_started", obj=run)
            transaction.on_commit(lambda: advance_drill_run.delay(run.pk))
    except IntegrityError as exc:
        raise ConflictError(
            "another drill run is in progress on this deployment.", field="deployment"
        ) from exc
    return run


def run_stop(*, tenant: Tenant, actor: Actor, run: DrillRun) -> DrillRun:
    """Manual stop: the next step reverts and ends the run as aborted."""
    with transaction.atomic():
        locked = DrillRun.objects.select_for_update().get(tenant=tenant, pk=run.pk)
        if not locked.is_active:
            raise ConflictError(f"the run is {locked.status}: nothing to stop.")
        if not locked.stop_requested:
            locked.stop_requested = True
            locked.save(update_fields=["stop_requested"])
            record_event(locked, "stop_requested", f"stop requested by {actor.label}")
            audit_record(tenant=tenant, actor=actor, action="drill.run_stopped", obj=locked)
    return locked
