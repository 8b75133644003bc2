"""The desired state, read from the rows: every live deployment's current revision (and the
shared pools) as specs, the GPU samplers, the Serve config and the unit plan compiled from them
and their digests; and config drift, where Serve runs another revision than the one the portal
applied (the graded, whole-config comparison is serving.deployments.drift). Reads only:
reconcile() (serving.deployments.reconcile) applies what this builds.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from django.conf import settings
from django.utils import timezone

from portal import tracing
from serving.control import isolate
from serving.control.cluster import RayTarget
from serving.control.compile import (
    DeploymentSpec,
    GpuNodesSpec,
    Placement,
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
from serving.control.serve_api import AppInfo, ServeApiClient
from serving.deployments.keys import cache_salt_hex, probe_key_hashes
from serving.deployments.models import Deployment, DeploymentRevision, KvMode, SharedPool
from serving.deployments.selectors import pool_share
from serving.deployments.tier_specs import tier_fields, tier_version_ids
from serving.deployments.traffic_specs import traffic_fields
from serving.registry import delivery
from serving.registry.models import ModelVersion
from tenants.models import Quota


def _slot(version: ModelVersion, engine: dict[str, Any] | None = None) -> SlotSpec:
    shape = json.dumps(
        {k: v for k, v in sorted((version.config_summary or {}).items()) if k != "format"},
        sort_keys=True,
    )
    return SlotSpec(
        version=f"{version.model.name}:{version.label}",
        artifact=delivery.artifact_ref(version),
        source=delivery.source(version),
        fingerprint=version.sha256,
        arch_key=hashlib.sha256(shape.encode()).hexdigest()[:16],
        engine=dict(engine or {"name": "builtin"}),
    )


def _spec(
    deployment: Deployment,
    revision: DeploymentRevision,
    *,
    pool_slots: int = 0,
    pool_access: bool = True,
    gpu_memory_mb: int | None = None,
) -> DeploymentSpec:
    tenant = deployment.tenant
    canary = revision.canary_version
    return DeploymentSpec(
        deployment_id=deployment.pk,
        tenant_id=str(tenant.pk),
        tenant_slug=tenant.slug,
        name=deployment.name,
        revision=revision.number,
        stable=_slot(revision.stable_version, revision.engine),
        canary=_slot(canary, revision.canary_engine or revision.engine)
        if canary is not None
        else None,
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
        gpu_memory_mb=gpu_memory_mb,
        cache_salt_hex=cache_salt_hex(tenant.pk),
        key_hashes=(*revision.key_hashes, *probe_key_hashes(deployment.pk)),
        batch_key_hashes=tuple(revision.batch_key_hashes),
        guard=revision.guard,
        breaker=revision.breaker,
        faults=revision.faults,
        pool=revision.pool.name if revision.pool is not None else None,
        pool_slots=pool_slots,
        pool_access=pool_access,
        suspended="" if tenant.is_active else "the platform suspended it",
        **tier_fields(revision, _slot),
        traffic=traffic_fields(deployment.pk, revision.traffic),
        kv_cache=dict(revision.kv_cache or {}),
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
        d
        for d in live
        if d.current_revision is not None
        and d.current_revision.kv_mode == KvMode.SHARED
        and d.current_revision.pool_id
    ]
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
    caps = dict(  # each tenant's GPU memory cap per replica (MiB), told to its engines
        Quota.objects.filter(tenant_id__in={d.tenant_id for d in live}).values_list(
            "tenant_id", "max_gpu_memory_mb_per_replica"
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
            cap = caps.get(deployment.tenant_id)
            specs.append(_spec(deployment, revision, gpu_memory_mb=cap))
        else:
            share = pool_share(pool, plan_blocks.get(deployment.tenant_id, 0))
            access = deployment.tenant_id in allowed[pool.pk]
            specs.append(
                _spec(deployment, revision, pool_slots=share.request_slots, pool_access=access)
            )
            if access and deployment.tenant.is_active:
                pool_tenants[pool.pk][str(deployment.tenant_id)] = PoolTenant(
                    salt=cache_salt_hex(deployment.tenant_id),
                    quota_blocks=share.quota_blocks,
                    max_running=share.max_running,
                    kv_cache=dict(revision.kv_cache or {}),
                    gpu_memory_mb=caps.get(deployment.tenant_id),
                )
        revision_ids.append(revision.pk)
    pool_specs = [
        PoolSpec(
            name=pool.name,
            slot=_slot(pool.model_version, pool.engine),
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
    return {"redis_url": settings.REDIS_URL, "prefix": settings.SLI_KEY_PREFIX}


def gpu_node_count(client: ServeApiClient) -> int:
    """The nodes that get a GPU sampler: the alive ones with GPUs, or every alive node where
    none has one (a CPU cluster: each says "no GPU", or streams the labelled simulation)."""
    alive = [n for n in client.nodes() if n.get("state") == "ALIVE"]
    with_gpus = [n for n in alive if float((n.get("resources_total") or {}).get("GPU", 0)) > 0]
    return len(with_gpus or alive)


def gpu_nodes_spec(client: ServeApiClient) -> GpuNodesSpec | None:
    """GPU_AGENT_MODE=ray: one sampler per node (the samples go to Redis)."""
    if settings.GPU_AGENT_MODE != "ray":
        return None
    return GpuNodesSpec(
        nodes=gpu_node_count(client),
        hz=settings.GPU_AGENT_HZ,
        simulate=settings.GPU_AGENT_SIMULATE,
    )


def live_versions() -> list[ModelVersion]:
    """The versions some live deployment or shared pool runs: what replicas may fetch."""
    live = Deployment.objects.filter(deleted_at__isnull=True, current_revision__isnull=False)
    ids = {
        pk
        for pair in live.values_list(
            "current_revision__stable_version_id", "current_revision__canary_version_id"
        )
        for pk in pair
        if pk is not None
    }
    ids |= set(SharedPool.objects.values_list("model_version_id", flat=True))
    ids |= tier_version_ids(live.values_list("current_revision__tiers", flat=True))
    return list(ModelVersion.objects.filter(pk__in=ids).order_by("pk"))


def placement(target: RayTarget) -> Placement:
    return Placement(target.proxy_location, dict(target.replica_resources))


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
        placement=placement(target),
    )
    return config, revision_ids


def plan_base(target: RayTarget) -> isolate.Plan:
    """A plan without units: what wraps every application the portal PUTs (HTTP options,
    placement, runtime env); `plan_base(t).config(units)` is the config PUT for `units`."""
    http = dict(target.serve_http_options) or {"host": "127.0.0.1", "port": 8001}
    return isolate.Plan(
        http_host=str(http.get("host", "127.0.0.1")),
        http_port=int(http.get("port", 8001)),
        placement=placement(target),
        # The portal's OTLP settings, for the replicas' spans (portal.tracing).
        runtime_env={"env_vars": tracing.dataplane_env()} if tracing.enabled() else None,
    )


def plan(
    target: RayTarget, client: ServeApiClient | None = None
) -> tuple[isolate.Plan, dict[str, int]]:
    """The desired state as units (each deployment, each pool, the GPU samplers), compiled one
    by one so that one that cannot be compiled is refused alone; also each deployment unit's
    revision id."""
    specs, pools, revision_ids = desired_state()
    result = plan_base(target)
    telemetry = _telemetry()
    client = client or target.serve_client()
    for name, config in sorted(isolate.foreign_declarative(client.details()).items()):
        result.add(isolate.foreign_unit(name), f"9:{name}", functools.partial(list, [config]))
    gpu = gpu_nodes_spec(client)
    if gpu is not None and gpu.nodes:
        result.add(isolate.GPU_UNIT, "0", lambda: gpu_nodes_apps(gpu, telemetry))
    known: set[str] = set()
    for pool in pools:
        known.add(pool.name)
        result.add(
            isolate.pool_unit(pool.name),
            f"1:{pool.name}",
            functools.partial(pool_apps, pool, telemetry),
        )
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
    return digest(
        {
            "units": units,
            "refused": planned.refused,
            "http": [planned.http_host, planned.http_port],
            "placement": [planned.placement.proxy_location, planned.placement.replica_resources],
            "runtime_env": planned.runtime_env,
        }
    )


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
