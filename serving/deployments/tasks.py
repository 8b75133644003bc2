"""Celery tasks of the deployments room: reconcile and the status refresh."""

from __future__ import annotations

import logging

from django.conf import settings

from portal.celery import task
from serving.control.serve_api import ServeApiError

logger = logging.getLogger(__name__)


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
    """Apply the desired state of every deployment to Ray Serve, then follow it until the
    applications settle (or 60 s pass; the periodic status refresh takes over then)."""
    from serving.deployments import reconcile as control

    run = control.reconcile(force=force)
    statuses = control.follow(timeout_s=60)
    return {"run": run.pk, "skipped": run.skipped, "statuses": statuses}


@task(name="serving.refresh_deployment_status", queue="health", time_limit=30)
def refresh_deployment_status() -> dict[int, str]:
    """What Serve reports, copied into the deployments (beat, every few seconds)."""
    from serving.deployments import reconcile as control

    ray_agents = settings.GPU_AGENT_MODE == "ray"
    if not control.has_deployments() and not ray_agents:
        return {}
    try:
        from serving.control.cluster import ray_target_from_env

        client = ray_target_from_env().serve_client()
        apps = client.applications()
        drifted = control.config_drift(apps)
        if drifted:  # Serve runs an older config than the portal applied: apply it again
            logger.warning("Serve runs stale configs of %s: reconciling", ", ".join(drifted))
            control.reconcile(force=True, client=client)
        elif ray_agents and control.gpu_nodes_changed(client, apps):
            logger.info("Ray nodes joined or left: declaring one GPU sampler per node")
            control.reconcile(client=client)
        return control.refresh_status(client=client)
    except ServeApiError as exc:  # no cluster yet (starting, or PORTAL_RAY=off): say so once
        logger.warning("deployment status not refreshed: %s", exc)
        return {}
