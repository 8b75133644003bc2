"""reconcile(): the one way into the data plane.

Compiles the current revision of every live deployment (and the shared pools) into one Serve
declarative config and PUTs it through the Serve REST API. Serialized by a row lock, so two
reconciles never interleave; idempotent, so an unchanged config is not re-applied; and the
only module on the Django side that talks to Ray. `refresh_status()` reads what Serve reports
back into the deployments (deploying, running, unhealthy, failed with Serve's message).

The desired state itself (rows -> specs, the plan, its digest, config drift) is built in
serving.deployments.specs; its names are re-exported here.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal import tracing
from portal.statelog import state_changed
from serving.control import isolate
from serving.control.capacity import ClusterCapacity
from serving.control.cluster import RayTarget, ray_target_from_env
from serving.control.names import is_portal_app
from serving.control.serve_api import AppInfo, AppStatus, ServeApiClient
from serving.deployments import capacity
from serving.deployments.models import (
    Deployment,
    DeploymentRevision,
    DeploymentStatus,
    ReconcileLock,
    ReconcileRun,
)
from serving.deployments.specs import (
    DRIFT_GRACE_S,
    compiled_config,
    config_drift,
    desired_state,
    digest,
    gpu_node_count,
    gpu_nodes_changed,
    gpu_nodes_spec,
    live_versions,
    plan,
    plan_digest,
)
from serving.registry import delivery

__all__ = [
    "DRIFT_GRACE_S",
    "REFUSED",
    "compiled_config",
    "config_drift",
    "desired_state",
    "digest",
    "UNSETTLED",
    "serve_client",
    "gpu_node_count",
    "gpu_nodes_changed",
    "gpu_nodes_spec",
    "has_deployments",
    "plan",
    "plan_digest",
    "reconcile",
    "refresh_status",
]

logger = logging.getLogger(__name__)


@tracing.traced("reconcile")
def reconcile(
    *, target: RayTarget | None = None, client: ServeApiClient | None = None, force: bool = False
) -> ReconcileRun:
    """Bring Serve to the desired state. An application Serve refuses is marked failed on its
    deployment (keeping its last good config) while every other change applies. Raises
    ServeApiError when Serve is unreachable or fails as a whole (the task retries it)."""
    target = target or ray_target_from_env()
    client = client or target.serve_client()
    started = time.monotonic()
    run = ReconcileRun.objects.create()
    try:
        # Files replicas fetch from object storage are there before Serve is told of them
        # (serving.registry.delivery; nothing to do for path or portal delivery).
        delivery.publish(live_versions())
        with transaction.atomic():
            # The one lock row, created by whichever reconcile comes first (ON CONFLICT DO
            # NOTHING: two first reconciles at once log no unique-violation error).
            ReconcileLock.objects.bulk_create([ReconcileLock(id=1)], ignore_conflicts=True)
            lock = ReconcileLock.objects.select_for_update().get(id=1)
            planned, revisions = plan(target, client)
            run.config_digest = plan_digest(planned)
            applied = isolate.units_from_json(lock.applied_config)
            have = {app["name"] for unit in applied.values() for app in unit.apps}
            # Imperative applications of other owners (`serve.run`) are not the portal's to
            # apply: Serve leaves them be, and their presence changes nothing here.
            running = {
                name for name in client.applications() if is_portal_app(name) or name in have
            }
            if not force and lock.last_digest == run.config_digest and running == have and applied:
                run.skipped = True
                run.applications = len(have)
            else:
                outcome = isolate.apply_isolating(client, planned, applied, force=force)
                now = timezone.now()
                lock.last_digest, lock.last_applied_at = run.config_digest, now
                lock.applied_config = {k: u.as_json() for k, u in outcome.applied.items()}
                lock.save(update_fields=["last_digest", "last_applied_at", "applied_config"])
                run.applications = sum(len(u.apps) for u in outcome.applied.values())
                _record_outcome(outcome, revisions, now)
                if outcome.refused:
                    run.error = (
                        "refused: "
                        + "; ".join(
                            f"{key}: {why}" for key, why in sorted(outcome.refused.items())
                        )[:4000]
                    )
        run.ok = True
    except Exception as exc:
        run.error = str(exc)[:4000]
        raise
    finally:
        run.finished_at = timezone.now()
        run.duration_ms = (time.monotonic() - started) * 1000
        run.save()
        summary = {"run": run.pk, "ok": run.ok, "skipped": run.skipped}
        tracing.annotate(**{f"portal.reconcile.{k}": v for k, v in summary.items()})
    return run


REFUSED = "REFUSED"


def _record_outcome(outcome: isolate.Outcome, revisions: dict[str, int], now: Any) -> None:
    """Stamp the revisions Serve took; mark the refused ones (and their deployments) failed
    with the reason, on that deployment alone."""
    taken = [rid for key, rid in revisions.items() if key not in outcome.refused]
    DeploymentRevision.objects.filter(pk__in=taken, applied_at__isnull=True).update(applied_at=now)
    DeploymentRevision.objects.filter(pk__in=taken, serve_status=REFUSED).update(
        serve_status="", serve_message=""
    )
    for key, why in outcome.refused.items():
        if key not in revisions:
            logger.error("Serve refused platform application %s: %s", key, why)
            continue
        revision = DeploymentRevision.objects.select_related("deployment").get(pk=revisions[key])
        message = f"Serve refused this revision; the last good one keeps serving. {why}"[:4000]
        revision.serve_status, revision.serve_message = REFUSED, message
        revision.save(update_fields=["serve_status", "serve_message"])
        deployment = revision.deployment
        deployment.status, deployment.status_message = DeploymentStatus.FAILED, message
        deployment.status_at = now
        deployment.save(update_fields=["status", "status_message", "status_at"])


_STATUS = {
    AppStatus.RUNNING: DeploymentStatus.RUNNING,
    AppStatus.DEPLOYING: DeploymentStatus.DEPLOYING,
    AppStatus.NOT_STARTED: DeploymentStatus.DEPLOYING,
    AppStatus.UNHEALTHY: DeploymentStatus.UNHEALTHY,
    AppStatus.DEPLOY_FAILED: DeploymentStatus.FAILED,
    AppStatus.DELETING: DeploymentStatus.DELETING,
}


_WORST = [
    DeploymentStatus.FAILED,
    DeploymentStatus.UNHEALTHY,
    DeploymentStatus.DEPLOYING,
    DeploymentStatus.DELETING,
    DeploymentStatus.RUNNING,
]


def _message(info: AppInfo) -> str:
    """Serve's own words: the deployments' messages (the cause) after the app's summary."""
    parts = [info.message] if info.message else []
    parts += [f"{d.name}: {d.message}" for d in info.deployments.values() if d.message]
    return "\n".join(parts)


def _starting(found: list[AppInfo]) -> int:
    """Replicas Serve wants that are not running yet (placed or not)."""
    waiting = 0
    for info in found:
        for deployment in info.deployments.values():
            running = sum(1 for r in deployment.replicas if r.state == "RUNNING")
            waiting += max(0, (deployment.target_num_replicas or 0) - running)
    return waiting


def refresh_status(*, client: ServeApiClient | None = None) -> dict[int, str]:
    """Copy what Serve reports into each deployment; mark revisions converged."""
    client = client or ray_target_from_env().serve_client()
    apps: dict[str, AppInfo] = client.applications()
    lock = ReconcileLock.objects.filter(id=1).first()
    applied_at = lock.last_applied_at if lock else None
    result: dict[int, str] = {}
    cluster: list[ClusterCapacity | None] | None = None  # read once, when a deployment waits
    deployments = Deployment.objects.select_related("tenant", "current_revision__pool").filter(
        current_revision__isnull=False
    )
    for deployment in deployments.exclude(status=DeploymentStatus.DELETED):
        revision = deployment.current_revision
        if revision is None:  # filtered out by the query
            continue
        own, shared = deployment.serve_apps(revision)
        names = own + shared
        if deployment.deleted_at is not None:
            gone = all(name not in apps for name in own)
            status = DeploymentStatus.DELETED if gone else DeploymentStatus.DELETING
            message = "removed from Serve" if gone else "Serve is removing it"
        elif revision.serve_status == REFUSED:
            status, message = DeploymentStatus.FAILED, revision.serve_message
        elif revision.applied_at is None:
            status, message = DeploymentStatus.PENDING, "waiting for reconcile"
        else:
            found = [apps[name] for name in names if name in apps]
            if len(found) < len(names):
                status, message = DeploymentStatus.DEPLOYING, "Serve has not listed it yet"
            else:
                mapped = [(_STATUS.get(i.status, DeploymentStatus.DEPLOYING), i) for i in found]
                status, info = min(mapped, key=lambda m: _WORST.index(m[0]))
                message = _message(info) or (
                    "" if status == DeploymentStatus.RUNNING else info.status
                )
                fresh = applied_at is None or all(
                    i.last_deployed_time_s >= applied_at.timestamp() - 1 for i in found
                )
                if status == DeploymentStatus.RUNNING and not fresh:
                    status = DeploymentStatus.DEPLOYING
                starting = _starting(found) if status == DeploymentStatus.DEPLOYING else 0
                if starting:  # Ray's reason, when it holds replicas it cannot place
                    if cluster is None:
                        cluster = [capacity.cluster_capacity(client=client)]
                    reason = capacity.waiting_reason(cluster[0], revision.spec(), starting)
                    message = "\n".join(part for part in (message, reason) if part)
        if status == DeploymentStatus.RUNNING and revision.converged_at is None:
            revision.converged_at = timezone.now()
            revision.serve_status, revision.serve_message = "RUNNING", ""
            revision.save(update_fields=["converged_at", "serve_status", "serve_message"])
        elif status in (DeploymentStatus.FAILED, DeploymentStatus.UNHEALTHY):
            revision.serve_status, revision.serve_message = status.upper(), message[:4000]
            revision.save(update_fields=["serve_status", "serve_message"])
        if status != deployment.status:
            state_changed(
                "deployment %s/%s: %s -> %s%s",
                deployment.tenant.slug,
                deployment.name,
                deployment.status,
                status,
                f" ({message[:200]})" if message else "",
            )
        if status != deployment.status or message != deployment.status_message:
            deployment.status, deployment.status_message = status, message[:4000]
            deployment.status_at = timezone.now()
            deployment.save(update_fields=["status", "status_message", "status_at"])
        result[deployment.pk] = status
    return result


def has_deployments() -> bool:
    return Deployment.objects.exclude(status=DeploymentStatus.DELETED).exists()


# Statuses an application passes through on its way to running, failed or gone.
UNSETTLED = frozenset(
    {DeploymentStatus.PENDING, DeploymentStatus.DEPLOYING, DeploymentStatus.DELETING}
)


def serve_client() -> ServeApiClient:
    """The Serve REST client of the configured cluster (the follow-up checks use it)."""
    return ray_target_from_env().serve_client()
