"""reconcile(): the one way into the data plane.

Compiles the current revision of every live deployment (and the shared pools) into one Serve
declarative config and PUTs it through the Serve REST API. Serialized by a row lock, so two
reconciles never interleave; idempotent, so an unchanged config is not re-applied; and the
only module on the Django side that talks to Ray. `refresh_status()` reads what Serve reports
back into the deployments (deploying, running, unhealthy, failed with Serve's message).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from serving.control import isolate
from serving.control.cluster import RayTarget, ray_target_from_env
from serving.control.compile import (
    DeploymentSpec,
    GpuNodesSpec,
    PoolSpec,
    PoolTenant,
    SlotSpec,
    compile_config,
    deployment_apps,
    gpu_nodes_apps,
    pool_apps,
    pool_max_ongoing,
)
from serving.control.names import GPU_NODES_APP, BadName
from serving.control.serve_api import AppInfo, AppStatus, ServeApiClient
from serving.deployments.keys import cache_salt_hex, probe_key_hashes
from serving.deployments.models import (
    Deployment,
    DeploymentRevision,
    DeploymentStatus,
    KvMode,
    ReconcileLock,
    ReconcileRun,
    SharedPool,
)
from serving.deployments.selectors import pool_share
from serving.registry import artifacts
from serving.registry.models import ModelVersion
from tenants.models import Quota

logger = logging.getLogger(__name__)


def _slot(version: ModelVersion) -> SlotSpec:
    shape = json.dumps(
        {k: v for k, v in sorted((version.config_summary or {}).items()) if k != "format"},
        sort_keys=True,
    )
    return SlotSpec(
        version=f"{version.model.name}:{version.label}",
        artifact=str(artifacts.local_directory(version.artifact_uri)),
        fingerprint=version.sha256,
        arch_key=hashlib.sha256(shape.encode()).hexdigest()[:16],
    )


def _spec(
    deployment: Deployment,
    revision: DeploymentRevision,
    *,
    pool_slots: int = 0,
    pool_access: bool = True,
) -> DeploymentSpec:
    tenant = deployment.tenant
    canary = revision.canary_version
    return DeploymentSpec(
        deployment_id=deployment.pk,
        tenant_id=str(tenant.pk),
        tenant_slug=tenant.slug,
        name=deployment.name,
        revision=revision.number,
        stable=_slot(revision.stable_version),
        canary=_slot(canary) if canary is not None else None,
        canary_percent=revision.canary_percent,
        num_replicas=revision.num_replicas,
        autoscaling=revision.autoscaling,
        num_cpus=revision.num_cpus,
        num_gpus=revision.num_gpus,
        max_ongoing_requests=revision.max_ongoing_requests,
        kv_mode=revision.kv_mode,
        kv_blocks=revision.kv_blocks,
        block_size=revision.block_size,
        quota_blocks=None,
        cache_salt_hex=cache_salt_hex(tenant.pk),
        key_hashes=(*revision.key_hashes, *probe_key_hashes(deployment.pk)),
        guard=revision.guard,
        breaker=revision.breaker,
        faults=revision.faults,
        pool=revision.pool.name if revision.pool is not None else None,
        pool_slots=pool_slots,
        pool_access=pool_access,
        suspended="" if tenant.is_active else "the platform suspended it",
    )


def desired_state() -> tuple[list[DeploymentSpec], list[PoolSpec], list[int]]:
    """Specs of every live deployment's current revision; also those revisions' ids.

    A shared pool serves only the tenants it allows (`SharedPool.allowed_tenants`) that are
    not suspended, each with its fair share (`pool_share`); the router of a deployment whose
    tenant lost its place answers 403 `pool_access_revoked` (its spec still compiles, so the
    last good config, which served it, does not live on)."""
    live = list(
        Deployment.objects.filter(deleted_at__isnull=True, current_revision__isnull=False)
        .select_related(
            "tenant",
            "current_revision__stable_version__model",
            "current_revision__canary_version__model",
            "current_revision__pool",
        )
        .order_by("pk")
    )
    shared = [
        d for d in live
        if d.current_revision is not None and d.current_revision.kv_mode == KvMode.SHARED
        and d.current_revision.pool_id
    ]  # fmt: skip
    pool_ids = {
        d.current_revision.pool_id
        for d in shared
        if d.current_revision is not None and d.current_revision.pool_id is not None
    }
    pools = {
        pool.pk: pool
        for pool in SharedPool.objects.filter(pk__in=pool_ids)
        .select_related("model_version__model")
        .prefetch_related("allowed_tenants")
    }
    allowed = {pk: {t.pk for t in pool.allowed_tenants.all()} for pk, pool in pools.items()}
    plan_blocks = dict(
        Quota.objects.filter(tenant_id__in={d.tenant_id for d in shared}).values_list(
            "tenant_id", "max_kv_blocks"
        )
    )
    specs: list[DeploymentSpec] = []
    revision_ids: list[int] = []
    pool_tenants: dict[int, dict[str, PoolTenant]] = {pk: {} for pk in pools}
    for deployment in live:
        revision = deployment.current_revision
        if revision is None:  # filtered out by the query
            continue
        pool = pools.get(revision.pool_id or 0) if revision.kv_mode == KvMode.SHARED else None
        if pool is None:
            specs.append(_spec(deployment, revision))
        else:
            share = pool_share(pool, plan_blocks.get(deployment.tenant_id, 0))
            access = deployment.tenant_id in allowed[pool.pk]
            specs.append(_spec(deployment, revision, pool_slots=share.request_slots,
                               pool_access=access))  # fmt: skip
            if access and deployment.tenant.is_active:
                pool_tenants[pool.pk][str(deployment.tenant_id)] = PoolTenant(
                    salt=cache_salt_hex(deployment.tenant_id),
                    quota_blocks=share.quota_blocks,
                    max_running=share.max_running,
                )
        revision_ids.append(revision.pk)
    pool_specs = [
        PoolSpec(
            name=pool.name,
            slot=_slot(pool.model_version),
            tenants=pool_tenants[pool.pk],
            num_replicas=pool.num_replicas,
            num_cpus=pool.num_cpus,
            num_gpus=pool.num_gpus,
            max_ongoing_requests=pool_max_ongoing(pool.max_num_seqs),
            kv_blocks=pool.kv_blocks,
            block_size=pool.block_size,
            max_num_seqs=pool.max_num_seqs,
        )
        for pool in sorted(pools.values(), key=lambda p: p.pk)
    ]
    return specs, pool_specs, revision_ids


def _telemetry() -> dict[str, Any]:
    return {"redis_url": settings.REDIS_URL or None, "prefix": settings.SLI_KEY_PREFIX}


def gpu_node_count(client: ServeApiClient) -> int:
    """The nodes that get a GPU sampler: the alive ones with GPUs, or every alive node where
    none has one (a CPU cluster: each says "no GPU", or streams the labelled simulation)."""
    alive = [n for n in client.nodes() if n.get("state") == "ALIVE"]
    with_gpus = [n for n in alive if float((n.get("resources_total") or {}).get("GPU", 0)) > 0]
    return len(with_gpus or alive)


def gpu_nodes_spec(client: ServeApiClient) -> GpuNodesSpec | None:
    """GPU_AGENT_MODE=ray (with Redis, where the samples go): one sampler per node."""
    if settings.GPU_AGENT_MODE != "ray" or not settings.REDIS_URL:
        return None
    return GpuNodesSpec(
        nodes=gpu_node_count(client), hz=settings.GPU_AGENT_HZ,
        simulate=settings.GPU_AGENT_SIMULATE,
    )  # fmt: skip


def compiled_config(
    target: RayTarget, client: ServeApiClient | None = None
) -> tuple[dict[str, Any], list[int]]:
    specs, pools, revision_ids = desired_state()
    http = dict(target.serve_http_options) or {"host": "127.0.0.1", "port": 8001}
    config = compile_config(
        specs,
        pools=pools,
        http_host=str(http.get("host", "127.0.0.1")),
        http_port=int(http.get("port", 8001)),
        telemetry=_telemetry(),
        gpu_nodes=gpu_nodes_spec(client or target.serve_client()),
    )
    return config, revision_ids


def plan(
    target: RayTarget, client: ServeApiClient | None = None
) -> tuple[isolate.Plan, dict[str, int]]:
    """The desired state as units (each deployment, each pool, the GPU samplers), compiled one
    by one so that one that cannot be compiled is refused alone; also each deployment unit's
    revision id."""
    specs, pools, revision_ids = desired_state()
    http = dict(target.serve_http_options) or {"host": "127.0.0.1", "port": 8001}
    result = isolate.Plan(http_host=str(http.get("host", "127.0.0.1")),
                          http_port=int(http.get("port", 8001)))  # fmt: skip
    telemetry = _telemetry()
    gpu = gpu_nodes_spec(client or target.serve_client())
    if gpu is not None and gpu.nodes:
        result.add(isolate.GPU_UNIT, "0", lambda: gpu_nodes_apps(gpu, telemetry))
    known: set[str] = set()
    for pool in pools:
        known.add(pool.name)
        result.add(isolate.pool_unit(pool.name), f"1:{pool.name}",
                   functools.partial(pool_apps, pool, telemetry))  # fmt: skip
    revisions: dict[str, int] = {}
    for spec, revision_id in zip(specs, revision_ids, strict=True):
        key = isolate.deployment_unit(spec.deployment_id)
        revisions[key] = revision_id

        def build(spec: DeploymentSpec = spec) -> list[dict[str, Any]]:
            if spec.pool is not None and spec.pool not in known:
                raise ValueError(f"shared pool {spec.pool!r} is not configured")
            return deployment_apps(spec, telemetry)

        result.add(key, f"2:{spec.tenant_slug}/{spec.name}", build)
    return result, revisions


def gpu_nodes_changed(client: ServeApiClient, apps: dict[str, AppInfo]) -> bool:
    """A node joined or left since the samplers were declared (the status refresh asks)."""
    spec = gpu_nodes_spec(client)
    if spec is None:
        return False
    info = apps.get(GPU_NODES_APP)
    declared = info.deployments.get("sampler") if info is not None else None
    have = declared.target_num_replicas if declared is not None else 0
    return have != spec.nodes


def digest(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def plan_digest(planned: isolate.Plan) -> str:
    units = {key: unit.as_json() for key, unit in planned.units.items()}
    return digest({"units": units, "refused": planned.refused,
                   "http": [planned.http_host, planned.http_port]})  # fmt: skip


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
        with transaction.atomic():
            lock, _ = ReconcileLock.objects.get_or_create(id=1)
            lock = ReconcileLock.objects.select_for_update().get(id=1)
            planned, revisions = plan(target, client)
            run.config_digest = plan_digest(planned)
            applied = isolate.units_from_json(lock.applied_config)
            running = {name for name in client.applications()}
            have = {app["name"] for unit in applied.values() for app in unit.apps}
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


# An applied revision Serve still does not run after this long is drift, not rollout lag.
DRIFT_GRACE_S = 15.0


def config_drift(apps: dict[str, AppInfo]) -> list[str]:
    """Routers whose deployed revision is not the revision the portal applied (a late PUT
    from a dead reconciler, a config changed behind the portal's back): names of the apps."""
    now = timezone.now()
    drifted = []
    live = Deployment.objects.filter(
        deleted_at__isnull=True, current_revision__applied_at__isnull=False
    ).select_related("tenant", "current_revision")
    for deployment in live:
        revision = deployment.current_revision
        if revision is None or revision.applied_at is None:
            continue
        try:
            info = apps.get(deployment.serve_app)
        except BadName:  # never compiled: the reconcile marked it failed
            continue
        if (
            info is not None
            and info.router_revision is not None
            and info.router_revision != revision.number
            and (now - revision.applied_at).total_seconds() > DRIFT_GRACE_S
        ):
            drifted.append(info.name)
    return drifted


def refresh_status(*, client: ServeApiClient | None = None) -> dict[int, str]:
    """Copy what Serve reports into each deployment; mark revisions converged."""
    client = client or ray_target_from_env().serve_client()
    apps: dict[str, AppInfo] = client.applications()
    lock = ReconcileLock.objects.filter(id=1).first()
    applied_at = lock.last_applied_at if lock else None
    result: dict[int, str] = {}
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
        if status == DeploymentStatus.RUNNING and revision.converged_at is None:
            revision.converged_at = timezone.now()
            revision.serve_status, revision.serve_message = "RUNNING", ""
            revision.save(update_fields=["converged_at", "serve_status", "serve_message"])
        elif status in (DeploymentStatus.FAILED, DeploymentStatus.UNHEALTHY):
            revision.serve_status, revision.serve_message = status.upper(), message[:4000]
            revision.save(update_fields=["serve_status", "serve_message"])
        if status != deployment.status or message != deployment.status_message:
            deployment.status, deployment.status_message = status, message[:4000]
            deployment.status_at = timezone.now()
            deployment.save(update_fields=["status", "status_message", "status_at"])
        result[deployment.pk] = status
    return result


def has_deployments() -> bool:
    return Deployment.objects.exclude(status=DeploymentStatus.DELETED).exists()


def follow(*, timeout_s: float = 60.0, interval_s: float = 0.5) -> dict[int, str]:
    """Refresh statuses until nothing is pending or deploying any more."""
    deadline = time.monotonic() + timeout_s
    client = ray_target_from_env().serve_client()
    while True:
        statuses = refresh_status(client=client)
        unsettled = {
            DeploymentStatus.PENDING,
            DeploymentStatus.DEPLOYING,
            DeploymentStatus.DELETING,
        }
        if not set(statuses.values()) & unsettled or time.monotonic() >= deadline:
            return statuses
        time.sleep(interval_s)
