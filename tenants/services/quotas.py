"""Tenant quotas: the default quotas of each plan (`PLAN_QUOTAS`, applied when a tenant is
created) and `quota_update`, the staff-only change of one tenant's quota."""

from __future__ import annotations

from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from portal.exceptions import PermissionDeniedError, ValidationFailed
from tenants.actors import Actor
from tenants.models import Plan, Quota, Tenant
from tenants.services.audit import audit_record, snapshot

PLAN_QUOTAS: dict[str, dict[str, int]] = {
    Plan.FREE: {
        "max_deployments": 3,
        "max_replicas": 4,
        "max_gpus": 1,
        "max_kv_blocks": 4096,
        "requests_per_second": 20,
        "max_storage_bytes": 10 * 2**30,
        "max_drills": 10,
        "max_concurrent_drill_runs": 1,
        "max_gpu_memory_mb_per_replica": 24576,  # 24 GiB
    },
    Plan.TEAM: {
        "max_deployments": 20,
        "max_replicas": 32,
        "max_gpus": 8,
        "max_kv_blocks": 65536,
        "requests_per_second": 100,
        "max_storage_bytes": 200 * 2**30,
        "max_drills": 50,
        "max_concurrent_drill_runs": 3,
        "max_gpu_memory_mb_per_replica": 81920,  # one 80 GiB GPU
    },
    Plan.ENTERPRISE: {
        "max_deployments": 200,
        "max_replicas": 256,
        "max_gpus": 64,
        "max_kv_blocks": 1048576,
        "requests_per_second": 500,
        "max_storage_bytes": 2 * 2**40,
        "max_drills": 200,
        "max_concurrent_drill_runs": 10,
        "max_gpu_memory_mb_per_replica": 655360,  # eight 80 GiB GPUs
    },
}
QUOTA_FIELDS = tuple(PLAN_QUOTAS[Plan.FREE])


def quota_update(*, tenant: Tenant, actor: Actor, changes: dict[str, int]) -> Quota:
    """Change a tenant's quota; only platform staff may (tenants cannot raise their own)."""
    if not actor.is_platform_staff:
        raise PermissionDeniedError("Only platform staff can change quotas.")
    unknown = sorted(set(changes) - set(QUOTA_FIELDS))
    if unknown:
        raise ValidationFailed(f"Unknown quota field {unknown[0]!r}.", field=unknown[0])
    for name, value in changes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValidationFailed("Must be a non-negative integer.", field=name)
    with transaction.atomic():
        quota = Quota.objects.select_for_update().get(tenant=tenant)
        before = snapshot(obj=quota, fields=QUOTA_FIELDS)
        for name, value in changes.items():
            setattr(quota, name, value)
        quota.updated_at = timezone.now()
        quota.full_clean()
        quota.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="quota.updated",
            obj=quota,
            before=before,
            after=snapshot(obj=quota, fields=QUOTA_FIELDS),
        )
        transaction.on_commit(lambda: cache.delete(f"quota-rps:{tenant.pk}"))
    return quota
