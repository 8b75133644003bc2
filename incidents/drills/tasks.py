"""Celery tasks of chaos drills: advancing a run, starting a scheduled drill, the resume sweep."""

from __future__ import annotations

from portal.celery import task


@task(name="incidents.advance_drill_run", queue="chaos", time_limit=60, idempotent=True)
def advance_drill_run(run_id: int) -> str | None:
    """One step of a drill run, then the next one enqueued (each step is idempotent)."""
    from incidents import drills

    delay = drills.run_advance(run_id)
    if delay is not None:
        advance_drill_run.apply_async((run_id,), countdown=delay)
    return None if delay is None else f"next step in {delay:g} s"


@task(name="incidents.start_scheduled_drill", queue="chaos", time_limit=30, idempotent=True)
def start_scheduled_drill(drill_id: int) -> int | None:
    """A drill's cron entry fired: start a run (skipped while another runs on the
    deployment, or once the drill is switched off)."""
    from incidents import drills
    from incidents.drills.models import ChaosDrill
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


@task(name="incidents.resume_drill_runs", queue="chaos", time_limit=30, idempotent=True)
def resume_drill_runs() -> int:
    """Beat, every 15 s: active runs whose step task died with a worker are stepped again,
    and the desired state is applied again: the dead worker may have held the reconcile of a
    run's injection or revert (late-acked on Redis, it comes back only after the broker's
    visibility timeout, an hour), and a run must not observe a fault that never went in."""
    from incidents.drills.selectors import runs_to_resume
    from serving.deployments.tasks import reconcile

    ids = runs_to_resume()
    if ids:
        reconcile.delay()  # idempotent: the same desired state is a no-op
    for run_id in ids:
        advance_drill_run.delay(run_id)
    return len(ids)
