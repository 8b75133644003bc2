"""Celery tasks of the serving room: thin wrappers that take ids and call services."""

from __future__ import annotations

import logging

from portal.celery import task
from serving import services
from serving.control.serve_api import ServeApiError
from serving.models import ModelVersion

logger = logging.getLogger(__name__)

# Checksumming, loading and one forward pass of a multi-GiB checkpoint on CPU take minutes.
VALIDATION_TIME_LIMIT_S = 1800


@task(queue="default", time_limit=VALIDATION_TIME_LIMIT_S, idempotent=True)
def validate_version(version_id: int) -> str | None:
    """Validate one model version; a missing or already finished version is left alone."""
    version = ModelVersion.objects.select_related("tenant").filter(pk=version_id).first()
    if version is None or version.is_final:
        return None
    result = services.version_validate(tenant=version.tenant, version_id=version_id)
    return None if result is None else result.status


@task(
    queue="default",
    time_limit=120,
    idempotent=True,
    autoretry_for=(ServeApiError,),
    retry_backoff=1,
    retry_backoff_max=30,
    max_retries=8,
)
def reconcile(force: bool = False) -> dict[str, object]:
    """Apply the desired state of every deployment to Ray Serve, then follow it until the
    applications settle (or 60 s pass; the periodic status refresh takes over then)."""
    from serving.control import reconcile as control

    run = control.reconcile(force=force)
    statuses = control.follow(timeout_s=60)
    return {"run": run.pk, "skipped": run.skipped, "statuses": statuses}


@task(queue="health", time_limit=30)
def refresh_deployment_status() -> dict[int, str]:
    """What Serve reports, copied into the deployments (beat, every few seconds)."""
    from serving.control import reconcile as control

    if not control.has_deployments():
        return {}
    try:
        return control.refresh_status()
    except ServeApiError as exc:  # no cluster yet (starting, or PORTAL_RAY=off): say so once
        logger.warning("deployment status not refreshed: %s", exc)
        return {}
