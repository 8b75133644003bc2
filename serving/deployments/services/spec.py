"""The desired state of a deployment, checked: the setting limits (guard, breaker, faults),
`clean_spec` (a whole spec validated, ValidationFailed naming the first bad field) and
`check_quota` (the tenant's deployments, replicas, GPUs and KV blocks, under its Quota row lock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from portal.exceptions import QuotaExceeded, ValidationFailed
from serving.dataplane import faults as faults_catalogue
from serving.deployments import replica_limits
from serving.deployments.kv_specs import clean_kv_cache
from serving.deployments.models import Deployment, KvMode, SharedPool
from serving.deployments.replica_memory import check_replica_memory
from serving.deployments.services.tiers import clean_tiers, tier_usage
from serving.deployments.spec_checks import checked_map, setting
from serving.deployments.traffic_specs import clean_traffic
from serving.engine.choice import (
    BUILTIN,
    VLLM,
    VLLM_UNSUPPORTED_FAULTS,
    EngineSpecError,
    clean_engine,
    name_of,
)
from serving.registry.models import ModelVersion
from tenants.models import Quota, Tenant

GUARD_LIMITS = {
    "max_body_bytes": (1, 16 * 1024 * 1024),
    "max_prompt_tokens": (1, 1 << 20),
    "max_tokens": (1, 1 << 16),
}
BREAKER_LIMITS = {
    "window_s": (1, 3600),
    "min_requests": (1, 100000),
    "failure_rate": (0.01, 1),
    "open_s": (0.1, 3600),
    "half_open_probes": (1, 1000),
    "canary_alpha": (0, 0.5),
    "slow_ms": (0, 600_000),
    "mirror_clean": (0, 1000),
}
# The chaos-drill fault catalogue lives with the replicas that apply it (Django-free).
FAULT_KEYS = faults_catalogue.FAULT_KEYS


def clean_spec(
    *, tenant: Tenant, spec: dict[str, Any], current_pool_id: int | None = None
) -> dict[str, Any]:
    """Validate a whole desired state; ValidationFailed names the first bad field.
    `current_pool_id`: the pool the deployment is on now (staying there is no new join)."""
    out = dict(spec)
    autoscaling = out.get("autoscaling")
    if autoscaling:
        if not isinstance(autoscaling, dict):
            raise ValidationFailed("must be an object.", field="autoscaling")
        allowed = {"min_replicas", "max_replicas", "target_ongoing_requests"}
        unknown = sorted(set(autoscaling) - allowed)
        if unknown:
            raise ValidationFailed(
                f"unknown field {unknown[0]!r}.", field=f"autoscaling.{unknown[0]}"
            )
        low = setting(autoscaling.get("min_replicas", 1), "autoscaling.min_replicas")
        high = setting(autoscaling.get("max_replicas", max(1, low)), "autoscaling.max_replicas")
        if high < low:
            raise ValidationFailed("must be >= min_replicas.", field="autoscaling.max_replicas")
        target = setting(
            autoscaling.get("target_ongoing_requests", 2), "autoscaling.target_ongoing_requests"
        )
        out["autoscaling"] = {
            "min_replicas": low,
            "max_replicas": high,
            "target_ongoing_requests": target,
        }
        out["num_replicas"] = None
    else:
        out["autoscaling"] = None
        out["num_replicas"] = setting(out.get("num_replicas") or 1, "num_replicas")
    defaults = {
        "num_cpus": 1.0,
        "num_gpus": 0.0,
        "max_ongoing_requests": 16,
        "kv_blocks": 256,
        "block_size": 16,
        "canary_percent": 0,
    }
    for field, default in defaults.items():
        out[field] = setting(out.get(field, default), field)
    if out.get("kv_mode") not in KvMode.values:
        raise ValidationFailed(f"must be one of {', '.join(KvMode.values)}.", field="kv_mode")
    if out["kv_mode"] == KvMode.SHARED:
        pool_id = out.get("pool_id")
        pool = SharedPool.objects.filter(pk=pool_id or 0, is_active=True).first()
        if pool is None:
            raise ValidationFailed("a shared deployment needs an active pool.", field="pool")
        # Joining a pool is the platform's grant, per tenant (a tenant the platform later
        # removes keeps its deployment, which reconcile then refuses to serve from the pool).
        if pool.pk != current_pool_id and not pool.allowed_tenants.filter(pk=tenant.pk).exists():
            raise ValidationFailed(
                f"this tenant is not allowed on pool {pool.name}; the platform grants pool access.",
                field="pool",
            )
        if out.get("canary_version_id"):
            raise ValidationFailed(
                "shared pools serve one version: no canary.", field="canary_version"
            )
    else:
        out["pool_id"] = None
    if out.get("canary_version_id") is None:
        out["canary_percent"] = 0.0
    elif out["canary_version_id"] == out["stable_version_id"]:
        raise ValidationFailed(
            "the canary must differ from the stable version.", field="canary_version"
        )
    _clean_engines(out)
    out["guard"] = checked_map(out.get("guard"), "guard", GUARD_LIMITS)
    out["breaker"] = checked_map(out.get("breaker"), "breaker", BREAKER_LIMITS)
    try:
        out["faults"] = faults_catalogue.validate_faults(out.get("faults"), "faults")
    except faults_catalogue.FaultSpecError as exc:
        raise ValidationFailed(exc.message, field=exc.field) from None
    _check_leak_caps(out)
    _check_engine_faults(out)
    out["tiers"] = clean_tiers(tenant=tenant, spec=out)
    out["traffic"] = clean_traffic(out.get("traffic"))
    out["kv_cache"] = clean_kv_cache(out)
    return out


def _clean_engines(out: dict[str, Any]) -> None:
    """Each slot's engine, checked, and allowed for its version (the engines the version was
    validated for). A shared deployment runs on its pool's engine; a canary without an engine
    of its own runs on the stable slot's."""
    if out["kv_mode"] == KvMode.SHARED:
        asked = out.get("engine")
        if name_of(asked if isinstance(asked, dict) else {"name": asked}) != BUILTIN:
            raise ValidationFailed("a shared deployment runs on its pool's engine.", field="engine")
        out["engine"], out["canary_engine"] = {"name": BUILTIN}, None
        return
    bounds = {
        "num_gpus": float(out["num_gpus"]),
        "max_cpu_kv_gib": float(settings.VLLM_MAX_CPU_KV_GIB),
    }
    try:
        out["engine"] = clean_engine(out.get("engine"), "engine", **bounds)
        canary = out.get("canary_engine") or out["engine"]
        out["canary_engine"] = (
            clean_engine(canary, "canary_engine", **bounds)
            if out.get("canary_version_id")
            else None
        )
    except EngineSpecError as exc:
        raise ValidationFailed(exc.message, field=exc.field) from None
    slots = [("stable_version_id", "engine"), ("canary_version_id", "canary_engine")]
    ids = [out[v] for v, _ in slots if out.get(v)]
    engines = dict(ModelVersion.objects.filter(pk__in=ids).values_list("pk", "engines"))
    for version_field, engine_field in slots:
        version_id = out.get(version_field)
        if not version_id:
            continue
        name = out[engine_field]["name"]
        allowed = engines.get(version_id) or [BUILTIN]
        if name not in allowed:
            raise ValidationFailed(
                f"this version is validated for {', '.join(allowed)}, not {name}: register it "
                f"with engines including {name!r}.",
                field=engine_field,
            )


def _check_engine_faults(spec: dict[str, Any]) -> None:
    """A fault that acts on the built-in engine's machinery is refused on a vLLM slot."""
    engines = {"stable": spec.get("engine"), "canary": spec.get("canary_engine")}
    for group, faults in spec["faults"].items():
        if (engines.get(group) or {}).get("name") != VLLM:
            continue
        for kind in faults:
            if kind in VLLM_UNSUPPORTED_FAULTS:
                raise ValidationFailed(
                    f"not on a vLLM slot: {VLLM_UNSUPPORTED_FAULTS[kind]}.",
                    field=f"faults.{group}.{kind}",
                )


def _check_leak_caps(spec: dict[str, Any]) -> None:
    """A memory-leak fault takes at most a share of the replica's own memory (its neighbours
    on the node run in the rest), whoever sets it: a drill or the deployment's settings."""
    shape = {"num_cpus": float(spec["num_cpus"]), "num_gpus": float(spec["num_gpus"])}
    for group, faults in spec["faults"].items():
        leak = faults.get("gpu_memory_leak")
        if leak and float(leak["max_mb"]) > replica_limits.leak_cap_mb(**shape):
            raise ValidationFailed(
                replica_limits.leak_cap_reason(**shape),
                field=f"faults.{group}.gpu_memory_leak.max_mb",
            )


def new_deployment_spec(
    *,
    tenant: Tenant,
    version: ModelVersion,
    settings: dict[str, Any] | None,
    key_hashes: list[str],
) -> dict[str, Any]:
    """The cleaned spec of a new deployment of `version` (deployable, checked by the caller)
    with the page's or API's `settings` (a pool named by `pool`): what deployment_create
    writes and its cost preview (serving.deployments.cost) reads."""
    settings = dict(settings or {})
    pool_name = settings.pop("pool", None)
    if pool_name:
        pool = SharedPool.objects.filter(name=pool_name).first()
        settings["pool_id"] = pool.pk if pool else -1
    return clean_spec(
        tenant=tenant,
        spec={
            "stable_version_id": version.pk,
            "canary_version_id": None,
            "kv_mode": settings.pop("kv_mode", KvMode.DEDICATED),
            **settings,
            "key_hashes": key_hashes,
        },
    )


def live_deployments(*, tenant: Tenant) -> QuerySet[Deployment]:
    return Deployment.objects.filter(tenant=tenant, deleted_at__isnull=True)


def spec_usage(*, spec: dict[str, Any]) -> dict[str, float]:
    """What a revision spec holds against the quota: replicas, GPUs and KV blocks at its
    largest (autoscaling: max_replicas), every slot counted (canary, tiers)."""
    slots = (2 if spec.get("canary_version_id") else 1) + tier_usage(spec=spec)
    if spec["kv_mode"] == KvMode.SHARED:
        return {"replicas": 0, "gpus": 0, "kv_blocks": 0}
    replicas = spec["autoscaling"]["max_replicas"] if spec["autoscaling"] else spec["num_replicas"]
    return {
        "replicas": replicas * slots,
        "gpus": replicas * slots * spec["num_gpus"],
        "kv_blocks": replicas * slots * spec["kv_blocks"],
    }


QUOTA_LIMITS = (("replicas", "max_replicas"), ("gpus", "max_gpus"), ("kv_blocks", "max_kv_blocks"))


@dataclass(frozen=True)
class QuotaUsage:
    """A spec against the tenant's quota: what it holds (`this`), what the tenant's other
    live deployments hold (`others`, `count` of them), and the quota."""

    quota: Quota
    count: int
    others: dict[str, float]
    this: dict[str, float]


def quota_usage(
    *, tenant: Tenant, spec: dict[str, Any], replacing: Deployment | None, lock: bool = False
) -> QuotaUsage:
    """The one reading of a spec against the quota, for the check (`lock`: the quota row
    locked until the transaction ends, so two creates cannot both fit) and the preview."""
    quotas = Quota.objects.select_for_update() if lock else Quota.objects
    quota = quotas.get(tenant=tenant)
    others = live_deployments(tenant=tenant).select_related("current_revision")
    if replacing is not None:
        others = others.exclude(pk=replacing.pk)
    held = {key: 0.0 for key, _ in QUOTA_LIMITS}
    count = 0
    for other in others:
        count += 1
        if other.current_revision is not None:
            for key, value in spec_usage(spec=other.current_revision.spec()).items():
                held[key] += value
    return QuotaUsage(quota=quota, count=count, others=held, this=spec_usage(spec=spec))


def check_quota(*, tenant: Tenant, spec: dict[str, Any], replacing: Deployment | None) -> None:
    usage = quota_usage(tenant=tenant, spec=spec, replacing=replacing, lock=True)
    quota = usage.quota
    if replacing is None and usage.count + 1 > quota.max_deployments:
        raise QuotaExceeded(
            f"the tenant may run {quota.max_deployments} deployments and has {usage.count}.",
            field="max_deployments",
        )
    for key, limit_name in QUOTA_LIMITS:
        total, limit = usage.this[key] + usage.others[key], int(getattr(quota, limit_name))
        if total > limit:
            field = {"replicas": "num_replicas", "gpus": "num_gpus", "kv_blocks": "kv_blocks"}[key]
            raise QuotaExceeded(
                f"this needs {total:g} {key.replace('_', ' ')} in all; the tenant's quota "
                f"is {limit} (max_{key}).",
                field=field,
            )
    check_replica_memory(quota=quota, spec=spec)  # the GPU memory cap per replica
