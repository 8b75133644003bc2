"""Shared pools are the platform's: staff create and change them (the admin saves through
`pool_save`). Each change is audited in every tenant the pool is or was granted to (a tenant
sees that its pool changed and whether it may still use it, never the other tenants), and
one reconcile follows on commit so the pool's replicas take the new settings."""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.db import transaction

from portal.exceptions import PermissionDeniedError, ValidationFailed
from portal.validation import clean_or_fail
from serving.deployments.models import SharedPool
from serving.deployments.services.revisions import reconcile_on_commit
from serving.engine.choice import BUILTIN, EngineSpecError, clean_engine
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services.audit import audit_record, snapshot

# What a granted tenant's audit row shows (not the serving version: another tenant's row id).
POOL_FIELDS = (
    "name",
    "num_replicas",
    "num_cpus",
    "num_gpus",
    "kv_blocks",
    "block_size",
    "min_tenants",
    "max_num_seqs",
    "is_active",
    "engine",
)


@transaction.atomic
def pool_save(
    *, pool: SharedPool, actor: Actor, allowed_tenants: Iterable[Tenant] | None = None
) -> SharedPool:
    """Create or change a shared pool (its fields as set on `pool`), and with
    `allowed_tenants` the tenants it is granted to. Platform staff only."""
    if not actor.is_platform_staff:
        raise PermissionDeniedError("only platform staff manage shared pools.")
    creating = pool.pk is None
    before_pool = None if creating else SharedPool.objects.select_for_update().get(pk=pool.pk)
    before = None if before_pool is None else snapshot(obj=before_pool, fields=POOL_FIELDS)
    granted_before = (
        set()
        if before_pool is None
        else set(before_pool.allowed_tenants.values_list("pk", flat=True))
    )
    clean_or_fail(pool)
    try:
        pool.engine = clean_engine(
            pool.engine,
            "engine",
            num_gpus=pool.num_gpus,
            max_cpu_kv_gib=float(settings.VLLM_MAX_CPU_KV_GIB),
        )
    except EngineSpecError as exc:
        raise ValidationFailed(exc.message, field=exc.field) from None
    allowed = pool.model_version.engines or [BUILTIN]
    if pool.engine["name"] not in allowed:
        raise ValidationFailed(
            f"the pool's version is validated for {', '.join(allowed)} only.", field="engine"
        )
    pool.save()
    if allowed_tenants is not None:
        pool.allowed_tenants.set(list(allowed_tenants))
    granted_after = set(pool.allowed_tenants.values_list("pk", flat=True))
    after = snapshot(obj=pool, fields=POOL_FIELDS)
    for tenant in Tenant.objects.filter(pk__in=granted_before | granted_after).order_by("pk"):
        audit_record(
            tenant=tenant,
            actor=actor,
            action="pool.create" if creating else "pool.update",
            obj=pool,
            before=None if before is None else {**before, "granted": tenant.pk in granted_before},
            after={**after, "granted": tenant.pk in granted_after},
        )
    reconcile_on_commit()
    return pool
