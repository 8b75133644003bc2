"""All writes of deployments: create, change (scale, canary, promote, keys), delete.

Every change is a new immutable revision of desired state, audited, followed on commit by
one reconcile (serving.control.reconcile) that brings Ray Serve to it.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from portal.exceptions import ConflictError, QuotaExceeded, ValidationFailed
from serving.dataplane import faults as faults_catalogue
from serving.deployments import gates, replica_limits
from serving.deployments.models import (
    DEPLOYMENT_NAME_RE,
    SPEC_FIELDS,
    Deployment,
    DeploymentRevision,
    DeploymentStatus,
    InferenceKey,
    KvMode,
    SharedPool,
)
from serving.registry.selectors import version_get_deployable
from tenants.actors import Actor
from tenants.models import Quota, Tenant
from tenants.services import audit_record

KEY_PREFIX = "ik_"
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
}
# The chaos-drill fault catalogue lives with the replicas that apply it (Django-free).
FAULT_KEYS = faults_catalogue.FAULT_KEYS


def _enqueue_reconcile() -> None:
    from django.conf import settings

    from serving.deployments.tasks import reconcile

    if settings.RECONCILE_ON_COMMIT:
        transaction.on_commit(lambda: reconcile.delay())


def new_inference_key() -> tuple[str, str]:
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    return raw, hashlib.sha256(raw.encode()).hexdigest()


def _number(value: Any, field: str, low: float, high: float, *, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationFailed(f"must be a number in [{low}, {high}].", field=field)
    if integer and int(value) != value:
        raise ValidationFailed("must be a whole number.", field=field)
    if not low <= value <= high:
        raise ValidationFailed(f"must be between {low} and {high}.", field=field)
    return int(value) if integer else float(value)


def _checked_map(raw: Any, field: str, limits: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise ValidationFailed("must be an object.", field=field)
    unknown = sorted(set(raw) - set(limits))
    if unknown:
        raise ValidationFailed(
            f"unknown setting {unknown[0]!r} (known: {', '.join(sorted(limits))}).",
            field=f"{field}.{unknown[0]}",
        )
    clean: dict[str, Any] = {}
    for key, value in raw.items():
        low, high = limits[key]
        # Limits given as ints are whole-number settings; float limits (rates) are not.
        integer = isinstance(low, int) and isinstance(high, int) and key != "failure_rate"
        clean[key] = _number(value, f"{field}.{key}", low, high, integer=integer)
    return clean


def _clean_spec(
    tenant: Tenant, spec: dict[str, Any], *, current_pool_id: int | None = None
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
        low = _number(
            autoscaling.get("min_replicas", 1), "autoscaling.min_replicas", 0, 1000, integer=True
        )
        high = _number(
            autoscaling.get("max_replicas", max(1, low)),
            "autoscaling.max_replicas",
            1,
            1000,
            integer=True,
        )
        if high < low:
            raise ValidationFailed("must be >= min_replicas.", field="autoscaling.max_replicas")
        target = _number(
            autoscaling.get("target_ongoing_requests", 2),
            "autoscaling.target_ongoing_requests",
            0.1,
            10000,
        )
        out["autoscaling"] = {
            "min_replicas": low,
            "max_replicas": high,
            "target_ongoing_requests": target,
        }
        out["num_replicas"] = None
    else:
        out["autoscaling"] = None
        out["num_replicas"] = _number(
            out.get("num_replicas") or 1, "num_replicas", 1, 1000, integer=True
        )
    out["num_cpus"] = _number(out.get("num_cpus", 1.0), "num_cpus", 0, 256)
    out["num_gpus"] = _number(out.get("num_gpus", 0.0), "num_gpus", 0, 64)
    out["max_ongoing_requests"] = _number(
        out.get("max_ongoing_requests", 16), "max_ongoing_requests", 1, 10000, integer=True
    )
    out["kv_blocks"] = _number(out.get("kv_blocks", 256), "kv_blocks", 16, 1 << 22, integer=True)
    out["block_size"] = _number(out.get("block_size", 16), "block_size", 1, 256, integer=True)
    out["canary_percent"] = _number(out.get("canary_percent", 0), "canary_percent", 0, 100)
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
    out["guard"] = _checked_map(out.get("guard"), "guard", GUARD_LIMITS)
    out["breaker"] = _checked_map(out.get("breaker"), "breaker", BREAKER_LIMITS)
    try:
        out["faults"] = faults_catalogue.validate_faults(out.get("faults"), "faults")
    except faults_catalogue.FaultSpecError as exc:
        raise ValidationFailed(exc.message, field=exc.field) from None
    _check_leak_caps(out)
    return out


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


def _live(tenant: Tenant) -> QuerySet[Deployment]:
    return Deployment.objects.filter(tenant=tenant, deleted_at__isnull=True)


def _usage(spec: dict[str, Any]) -> dict[str, float]:
    slots = 2 if spec.get("canary_version_id") else 1
    if spec["kv_mode"] == KvMode.SHARED:
        return {"replicas": 0, "gpus": 0, "kv_blocks": 0}
    replicas = spec["autoscaling"]["max_replicas"] if spec["autoscaling"] else spec["num_replicas"]
    return {
        "replicas": replicas * slots,
        "gpus": replicas * slots * spec["num_gpus"],
        "kv_blocks": replicas * slots * spec["kv_blocks"],
    }


def _check_quota(tenant: Tenant, spec: dict[str, Any], *, replacing: Deployment | None) -> None:
    quota = Quota.objects.select_for_update().get(tenant=tenant)
    others = _live(tenant).select_related("current_revision")
    if replacing is not None:
        others = others.exclude(pk=replacing.pk)
    if replacing is None and others.count() + 1 > quota.max_deployments:
        raise QuotaExceeded(
            f"the tenant may run {quota.max_deployments} deployments and has {others.count()}.",
            field="max_deployments",
        )
    total = _usage(spec)
    for other in others:
        if other.current_revision is not None:
            for key, value in _usage(other.current_revision.spec()).items():
                total[key] += value
    limits = {
        "replicas": quota.max_replicas,
        "gpus": quota.max_gpus,
        "kv_blocks": quota.max_kv_blocks,
    }
    for key, limit in limits.items():
        if total[key] > limit:
            field = {"replicas": "num_replicas", "gpus": "num_gpus", "kv_blocks": "kv_blocks"}[key]
            raise QuotaExceeded(
                f"this needs {total[key]:g} {key.replace('_', ' ')} in all; the tenant's quota "
                f"is {limit} (max_{key}).",
                field=field,
            )


def _write_revision(
    tenant: Tenant, actor: Actor, deployment: Deployment, spec: dict[str, Any], reason: str
) -> DeploymentRevision:
    last = deployment.revisions.order_by("-number").first()
    revision = DeploymentRevision.objects.create(
        tenant=tenant,
        deployment=deployment,
        number=(last.number + 1) if last else 1,
        reason=reason[:200],
        created_by_id=actor.user_id,
        **{k: v for k, v in spec.items() if k in SPEC_FIELDS},
    )
    deployment.current_revision = revision
    deployment.status = DeploymentStatus.PENDING
    deployment.status_message = f"revision {revision.number}: {reason}"
    deployment.status_at = timezone.now()
    deployment.save(update_fields=["current_revision", "status", "status_message", "status_at"])
    return revision


def _snapshot(revision: DeploymentRevision) -> dict[str, Any]:
    spec = revision.spec()
    spec.pop("key_hashes", None)  # never in audit rows
    return {"revision": revision.number, **spec}


def _locked(tenant: Tenant, deployment: Deployment) -> Deployment:
    locked = (
        Deployment.objects.select_for_update(of=("self",))
        .select_related("current_revision")
        .get(pk=deployment.pk, tenant=tenant)
    )
    if locked.deleted_at is not None:
        raise ConflictError("this deployment is deleted.", field="deployment")
    if locked.current_revision is None:
        raise ConflictError("this deployment has no revision.", field="deployment")
    return locked


def _current(deployment: Deployment) -> DeploymentRevision | None:
    """The current revision as the database has it (the caller's object may be older)."""
    return (
        DeploymentRevision.objects.filter(current_of__pk=deployment.pk).first()
        if deployment.pk
        else None
    )


def deployment_create(
    *,
    tenant: Tenant,
    actor: Actor,
    name: str,
    version_id: Any,
    description: str = "",
    settings: dict[str, Any] | None = None,
) -> tuple[Deployment, str]:
    """A new deployment serving `version_id`; returns it and its first inference key (shown
    once)."""
    import re

    name = (name or "").strip()
    if not re.fullmatch(DEPLOYMENT_NAME_RE, name):
        raise ValidationFailed(
            "use 1-40 lower-case letters, digits and '-', starting and ending alphanumeric.",
            field="name",
        )
    version = version_get_deployable(tenant=tenant, version_id=version_id, field="version")
    raw_key, key_hash = new_inference_key()
    settings = dict(settings or {})
    pool_name = settings.pop("pool", None)
    if pool_name:
        pool = SharedPool.objects.filter(name=pool_name).first()
        settings["pool_id"] = pool.pk if pool else -1
    spec = _clean_spec(
        tenant,
        {
            "stable_version_id": version.pk,
            "canary_version_id": None,
            "kv_mode": settings.pop("kv_mode", KvMode.DEDICATED),
            **settings,
            "key_hashes": [key_hash],
        },
    )
    with transaction.atomic():
        _check_quota(tenant, spec, replacing=None)
        if _live(tenant).filter(name=name).exists():
            raise ConflictError(f"a deployment named {name!r} exists.", field="name")
        try:
            deployment = Deployment.objects.create(
                tenant=tenant, name=name, description=description, created_by_id=actor.user_id
            )
        except IntegrityError:
            raise ConflictError(f"a deployment named {name!r} exists.", field="name") from None
        InferenceKey.objects.create(
            tenant=tenant,
            deployment=deployment,
            name="default",
            prefix=raw_key[:12],
            key_hash=key_hash,
        )
        revision = _write_revision(tenant, actor, deployment, spec, f"created with {version}")
        audit_record(
            tenant=tenant,
            actor=actor,
            action="deployment.created",
            obj=deployment,
            after=_snapshot(revision),
        )
        _enqueue_reconcile()
    return deployment, raw_key


def deployment_change(
    *,
    tenant: Tenant,
    actor: Actor,
    deployment: Deployment,
    changes: dict[str, Any],
    reason: str,
    action: str = "deployment.changed",
    reconcile: bool = True,
) -> DeploymentRevision:
    """A new revision: the current desired state with `changes` applied. `reconcile=False`
    leaves applying it to the caller (a rollback reconciles at once, in its own task)."""
    with transaction.atomic():
        locked = _locked(tenant, deployment)
        current = locked.current_revision
        if current is None:  # _locked() refused that already; keeps mypy informed
            raise ConflictError("this deployment has no revision.", field="deployment")
        changes = dict(changes)
        for field in ("stable_version", "canary_version"):
            if field in changes:
                value = changes.pop(field)
                changes[f"{field}_id"] = (
                    None
                    if value is None
                    else version_get_deployable(tenant=tenant, version_id=value, field=field).pk
                )
        if "num_replicas" in changes and changes["num_replicas"] is not None:
            changes.setdefault("autoscaling", None)
        spec = _clean_spec(tenant, {**current.spec(), **changes}, current_pool_id=current.pool_id)
        if spec == current.spec():
            return current  # nothing changes: no revision, no reconcile
        _check_quota(tenant, spec, replacing=locked)
        revision = _write_revision(tenant, actor, locked, spec, reason)
        deployment.current_revision = revision  # the caller's object follows
        audit_record(
            tenant=tenant,
            actor=actor,
            action=action,
            obj=locked,
            before=_snapshot(current),
            after=_snapshot(revision),
        )
        if reconcile:
            _enqueue_reconcile()
    return revision


def deployment_set_canary(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, version_id: Any, percent: float
) -> DeploymentRevision:
    percent = _number(percent, "percent", 0, 100)
    return deployment_change(
        tenant=tenant,
        actor=actor,
        deployment=deployment,
        changes={"canary_version": version_id, "canary_percent": percent},
        reason=f"canary at {percent:g}%",
        action="deployment.canary_set",
    )


def deployment_set_traffic(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, percent: float
) -> DeploymentRevision:
    """Weights only: live replicas are reconfigured, none restarts."""
    percent = _number(percent, "percent", 0, 100)
    current = _current(deployment)
    if current is None or current.canary_version_id is None:
        raise ConflictError("there is no canary to send traffic to.", field="percent")
    return deployment_change(
        tenant=tenant,
        actor=actor,
        deployment=deployment,
        changes={"canary_percent": percent},
        reason=f"canary traffic {percent:g}%",
        action="deployment.traffic_set",
    )


def deployment_promote(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, skip_gate: bool = False
) -> DeploymentRevision:
    """The canary becomes stable (a hot reload). A contract whose gate is `block` refuses
    while the canary misses a gated objective (the error names it)."""
    current = _current(deployment)
    if current is None or current.canary_version_id is None:
        raise ConflictError("there is no canary to promote.", field="deployment")
    if not skip_gate:
        why = gates.blocking(deployment, current)
        if why is not None:
            raise ConflictError(f"the SLA contract blocks promotion: {why}", field="gate")
    return deployment_change(
        tenant=tenant,
        actor=actor,
        deployment=deployment,
        changes={
            "stable_version_id": current.canary_version_id,
            "canary_version_id": None,
            "canary_percent": 0,
        },
        reason="canary promoted to stable",
        action="deployment.promoted",
    )


def deployment_delete(*, tenant: Tenant, actor: Actor, deployment: Deployment) -> None:
    with transaction.atomic():
        locked = _locked(tenant, deployment)
        locked.deleted_at = timezone.now()
        locked.status = DeploymentStatus.DELETING
        locked.status_message = "removing from Serve"
        locked.status_at = locked.deleted_at
        locked.save(update_fields=["deleted_at", "status", "status_message", "status_at"])
        audit_record(
            tenant=tenant,
            actor=actor,
            action="deployment.deleted",
            obj=locked,
            before={"name": locked.name},
        )
        _enqueue_reconcile()


def _keys_changed(tenant: Tenant, actor: Actor, deployment: Deployment, reason: str) -> None:
    hashes = sorted(
        InferenceKey.objects.filter(deployment=deployment, revoked_at__isnull=True).values_list(
            "key_hash", flat=True
        )
    )
    deployment_change(
        tenant=tenant,
        actor=actor,
        deployment=deployment,
        changes={"key_hashes": hashes},
        reason=reason,
        action="deployment.keys_rotated",
    )


def inference_key_create(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, name: str, probe: bool = False
) -> tuple[InferenceKey, str]:
    name = (name or "").strip()
    if not name or len(name) > 80:
        raise ValidationFailed("give a name of 1-80 characters.", field="name")
    raw, key_hash = new_inference_key()
    with transaction.atomic():
        _locked(tenant, deployment)
        key = InferenceKey.objects.create(
            tenant=tenant,
            deployment=deployment,
            name=name,
            prefix=raw[:12],
            key_hash=key_hash,
            is_probe=probe,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="inference_key.created",
            obj=key,
            after={"name": name, "prefix": key.prefix},
        )
        _keys_changed(tenant, actor, deployment, f"key {key.prefix} added")
    return key, raw


def inference_key_revoke(*, tenant: Tenant, actor: Actor, key: InferenceKey) -> InferenceKey:
    with transaction.atomic():
        locked = InferenceKey.objects.select_for_update().get(pk=key.pk, tenant=tenant)
        if locked.revoked_at is not None:
            return locked
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        audit_record(
            tenant=tenant,
            actor=actor,
            action="inference_key.revoked",
            obj=locked,
            before={"prefix": locked.prefix},
        )
        _keys_changed(tenant, actor, locked.deployment, f"key {locked.prefix} revoked")
    return locked
