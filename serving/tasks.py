"""Celery tasks of the serving room: thin wrappers that take ids and call services."""

from __future__ import annotations

import logging

from django.conf import settings

from portal.celery import task
from serving import services
from serving.control.serve_api import ServeApiError
from serving.models import ModelVersion

logger = logging.getLogger(__name__)

# Checksumming, loading and one forward pass of a multi-GiB checkpoint on CPU take minutes.
VALIDATION_TIME_LIMIT_S = 1800


@task(queue="default", time_limit=VALIDATION_TIME_LIMIT_S, idempotent=True)
def validate_version(version_id: int) -> str | None:
    """Validate one model version; a missing or already finished version is left alone.

    Acknowledged late, so a worker killed mid-validation hands it to another; the service
    counts the runs and fails the version after MODEL_VALIDATION_MAX_ATTEMPTS instead of
    letting one poisonous checkpoint kill worker after worker."""
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


@task(queue="health", time_limit=30)
def health_tick() -> dict[str, object]:
    """Probe, read the replicas' SLI counters, store and evaluate them against the contracts,
    act on breaches, advance rollouts (beat, every HEALTH_TICK_S)."""
    from serving import health
    from serving.control.cluster import ray_target_from_env

    if not settings.REDIS_URL:  # embedded mode: replicas publish their SLIs to Redis only
        if not getattr(health_tick, "_warned", False):
            logger.warning("health checks need Redis (REDIS_URL): SLIs are not evaluated")
            health_tick._warned = True
        return {"skipped": "no Redis"}
    try:
        serve_url: str | None = ray_target_from_env().serve_url
    except Exception:  # no cluster configured: SLIs and contracts still evaluate
        serve_url = None
    return health.tick(serve_url=serve_url if settings.HEALTH_PROBES else None)


@task(
    queue="health",
    time_limit=60,
    idempotent=True,
    autoretry_for=(ServeApiError,),
    retry_backoff=1,
    retry_backoff_max=10,
    max_retries=10,
)
def execute_rollback(rollback_id: int) -> str | None:
    """Run or resume one rollback (idempotent: a re-delivered or re-enqueued task finds the
    revision already written and only finishes what is left)."""
    from serving.rollbacks import rollback_execute

    rollback = rollback_execute(rollback_id=rollback_id)
    return None if rollback is None else rollback.status


@task(queue="health", time_limit=120)
def prune_sli_samples() -> dict[str, int]:
    """Raw SLI rows and 1 s GPU rows live an hour, minute rows 30 days."""
    import time

    from serving import gpu_agent
    from serving.sli_store import prune

    now = time.time()
    return {**prune(now=now), **gpu_agent.prune(now=now)}
