"""Celery tasks of the incidents room: thin wrappers that take ids and call services."""

from __future__ import annotations

from typing import Any

from incidents import notify
from portal.celery import task


@task(queue="default", time_limit=30, idempotent=True, bind=True, max_retries=notify.MAX_ATTEMPTS)
def deliver_notification(self: Any, delivery_id: int) -> str:
    """Send one notification; retried with exponential backoff (2**attempts s) while the
    receiver is down or answers 5xx/429. A gone or finished delivery is left alone; one of a
    suspended tenant (or a switched-off channel) ends failed without being sent."""
    outcome = notify.delivery_attempt(delivery_id=delivery_id)
    if outcome.retry_in is not None:
        raise self.retry(countdown=outcome.retry_in)
    return outcome.status


@task(queue="default", time_limit=60, idempotent=True)
def sweep_notifications() -> int:
    """Beat, every minute: deliveries whose task was lost are sent again."""
    return len(notify.deliveries_sweep())


@task(queue="chaos", time_limit=60, idempotent=True)
def advance_drill_run(run_id: int) -> str | None:
    """One step of a drill run, then the next one enqueued (each step is idempotent)."""
    from incidents import drills

    delay = drills.run_advance(run_id)
    if delay is not None:
        advance_drill_run.apply_async((run_id,), countdown=delay)
    return None if delay is None else f"next step in {delay:g} s"


@task(queue="chaos", time_limit=30, idempotent=True)
def start_scheduled_drill(drill_id: int) -> int | None:
    """A drill's cron entry fired: start a run (skipped while another runs on the
    deployment, or once the drill is switched off)."""
    from incidents import drills
    from incidents.drill_models import ChaosDrill
    from portal.exceptions import ConflictError
    from tenants.actors import Actor

    drill = ChaosDrill.objects.select_related("tenant", "deployment").filter(pk=drill_id).first()
    if drill is None or not drill.is_active or drill.deployment.deleted_at is not None:
        return None
    try:
        run = drills.run_start(
            tenant=drill.tenant, actor=Actor(system="schedule"), drill=drill, trigger="schedule"
        )
    except ConflictError:
        return None
    return run.pk


@task(queue="chaos", time_limit=30, idempotent=True)
def resume_drill_runs() -> int:
    """Beat, every 15 s: active runs whose step task died with a worker are stepped again."""
    from incidents import drills

    ids = drills.runs_to_resume()
    for run_id in ids:
        advance_drill_run.delay(run_id)
    return len(ids)
