"""Celery tasks of the deployments room: reconcile and the status refresh."""

from __future__ import annotations

import logging
import time

from django.conf import settings

from portal.celery import task
from serving.control.serve_api import ServeApiError

logger = logging.getLogger(__name__)


# After a reconcile the applications are followed by short re-checks, each a task of its own
# a second apart, never by a worker held until they settle (it held one for 60 s, and a model
# validation queued behind it took 68 s instead of 2).
FOLLOW_EVERY_S = 1.0
FOLLOW_FOR_S = 60.0  # then the periodic status refresh (beat) carries on


@task(
    name="serving.reconcile",
    queue="default",
    time_limit=120,
    idempotent=True,
    autoretry_for=(ServeApiError,),
    retry_backoff=1,
    retry_backoff_max=30,
    max_retries=8,
)
def reconcile(force: bool = False) -> dict[str, object]:
    """Apply the desired state of every deployment to Ray Serve, then hand the following of
    the applications to `follow_deployments` (short re-checks until they settle)."""
    from serving.deployments import reconcile as control

    run = control.reconcile(force=force)
    follow_later(until=time.time() + FOLLOW_FOR_S)
    return {"run": run.pk, "skipped": run.skipped}


def follow_later(*, until: float) -> None:
    """One more status check in FOLLOW_EVERY_S, unless `until` has passed. Eager tasks (the
    unit tests) cannot wait: there the beat's periodic refresh is the only follow-up."""
    if time.time() < until and not getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):
        follow_deployments.apply_async(kwargs={"until": until}, countdown=FOLLOW_EVERY_S)


@task(name="serving.follow_deployments", queue="default", time_limit=30, idempotent=True)
def follow_deployments(until: float) -> dict[int, str]:
    """One status refresh after a reconcile; another in a second while an application is
    still pending, deploying or deleting (and `until` has not passed)."""
    from serving.deployments import reconcile as control

    try:
        statuses = control.refresh_status(client=control.serve_client())
    except ServeApiError as exc:
        logger.warning("following the deployments: %s", exc)
        statuses = {}
    if not statuses or set(statuses.values()) & control.UNSETTLED:
        follow_later(until=until)
    return statuses


@task(name="serving.refresh_deployment_status", queue="health", time_limit=30)
def refresh_deployment_status() -> dict[int, str]:
    """What Serve reports, copied into the deployments (beat, every few seconds)."""
    from serving.deployments import reconcile as control

    ray_agents = settings.GPU_AGENT_MODE == "ray"
    if not control.has_deployments() and not ray_agents:
        return {}
    try:
        from serving.control.cluster import ray_target_from_env
        from serving.deployments.drift import drift_check

        target = ray_target_from_env()
        client = target.serve_client()
        read_at = time.time()
        apps = client.applications()
        drifted = control.config_drift(apps)
        check = drift_check(apps=apps, read_at=read_at, target=target)
        if drifted or check.reconcile_needed:  # Serve runs another config: apply ours again
            graded = [f"{f.unit} {f.grade}" for f in check.findings]
            logger.warning("Serve runs drifted configs (%s): reconciling", drifted + graded)
            control.reconcile(force=True, target=target, client=client)
        elif ray_agents and control.gpu_nodes_changed(client, apps):
            logger.info("Ray nodes joined or left: declaring one GPU sampler per node")
            control.reconcile(client=client)
        return control.refresh_status(client=client)
    except ServeApiError as exc:  # no cluster yet (starting, or PORTAL_RAY=off): say so once
        logger.warning("deployment status not refreshed: %s", exc)
        return {}
