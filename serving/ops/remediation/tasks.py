"""Celery task of remediation: advance one run (a step, or the end of a wait)."""

from __future__ import annotations

from portal.celery import task


@task(name="serving.advance_remediation", queue="default", time_limit=1800, idempotent=True)
def advance_remediation(run_id: int) -> str | None:
    """Run the run's due steps (idempotent: the lease and the step rows make a re-delivered or
    early task a no-op; a wait's task that comes early leaves it to the health tick)."""
    from serving.ops.remediation.services import remediation_advance

    run = remediation_advance(run_id=run_id)
    return None if run is None else run.status
