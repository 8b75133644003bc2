"""Reads of deployments, revisions and inference keys (always inside one tenant), and a
shared deployment's fair share of its pool."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from serving.control.names import pool_app
from serving.control.specs import FairShare, fair_share, pool_max_ongoing
from serving.deployments.models import Deployment, DeploymentRevision, InferenceKey, SharedPool
from tenants.models import Quota, Tenant
from tenants.scoping import get_for_tenant


def deployment_list(*, tenant: Tenant, include_deleted: bool = False) -> QuerySet[Deployment]:
    queryset = Deployment.objects.filter(tenant=tenant).select_related(
        "tenant",
        "current_revision__stable_version__model",
        "current_revision__canary_version__model",
        "current_revision__pool",
    )
    if not include_deleted:
        queryset = queryset.filter(deleted_at__isnull=True)
    return queryset.order_by("-id")


def deployment_get(*, tenant: Tenant, pk: Any) -> Deployment:
    """A live deployment of `tenant`; missing, deleted and foreign ones are the same 404."""
    return get_for_tenant(deployment_list(tenant=tenant), tenant=tenant, pk=pk)


def revision_list(*, tenant: Tenant, deployment: Deployment) -> QuerySet[DeploymentRevision]:
    return (
        DeploymentRevision.objects.filter(tenant=tenant, deployment=deployment)
        .select_related("stable_version__model", "canary_version__model", "pool")
        .order_by("-number")
    )


def inference_key_list(*, tenant: Tenant, deployment: Deployment) -> QuerySet[InferenceKey]:
    return InferenceKey.objects.filter(tenant=tenant, deployment=deployment).order_by("-id")


def pool_share(pool: SharedPool, plan_blocks: int) -> FairShare:
    """The fair share of `pool` for a tenant whose plan gives it `plan_blocks` KV blocks
    (per pool replica): what reconcile compiles into the pool, and what the tenant is shown."""
    return fair_share(
        plan_blocks=plan_blocks,
        kv_blocks=pool.kv_blocks,
        max_num_seqs=pool.max_num_seqs,
        min_tenants=pool.min_tenants,
        max_ongoing_requests=pool_max_ongoing(pool.max_num_seqs),
        num_replicas=pool.num_replicas,
    )


def _published_use(pool: SharedPool, tenant_id: str) -> list[dict[str, Any]] | None:
    """The tenant's entry in each pool replica's published KV stats (its own entry only:
    the others' stay unread); None when Redis does not answer."""
    import redis

    key = f"{settings.SLI_KEY_PREFIX}:sli:{pool_app(pool.name)}:pool"
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        values = client.hgetall(key).values()
    except redis.RedisError:
        return None
    entries = []
    for raw in values:
        try:
            kv = json.loads(raw).get("kv") or {}
        except (ValueError, AttributeError):
            continue
        entries.append(dict((kv.get("tenants") or {}).get(tenant_id) or {}))
    return entries


def deployment_pool_share(*, tenant: Tenant, deployment: Deployment) -> dict[str, Any] | None:
    """A shared deployment's place in its pool: its fair share (all pool replicas together)
    and what it uses now, as the pool's replicas publish it; None for a dedicated one."""
    revision = deployment.current_revision
    if deployment.tenant_id != tenant.pk or revision is None or revision.pool is None:
        return None
    pool = revision.pool
    allowed = tenant.is_active and pool.allowed_tenants.filter(pk=tenant.pk).exists()
    plan = Quota.objects.filter(tenant=tenant).values_list("max_kv_blocks", flat=True).first()
    share = pool_share(pool, plan or 0)
    replicas = pool.num_replicas
    entries = _published_use(pool, str(tenant.pk))

    def used(field: str) -> int | None:
        return None if entries is None else sum(int(e.get(field) or 0) for e in entries)

    return {
        "pool": pool.name,
        "allowed": allowed,
        "tenants_min": pool.min_tenants,
        "replicas": replicas,
        "quota_blocks": share.quota_blocks * replicas if allowed else 0,
        "max_running": share.max_running * replicas if allowed else 0,
        "blocks_used": used("blocks_used"),
        "running": used("running"),
        "waiting": used("waiting"),
        "replicas_reporting": None if entries is None else len(entries),
    }


def quota_use(*, deployments: list[Deployment]) -> dict[str, float]:
    """Replicas, GPUs and KV blocks the tenant's live `deployments` (their current revisions,
    as deployment_list loads them) hold against its quota: what check_quota adds up."""
    from serving.deployments.services.spec import spec_usage

    total = {"replicas": 0.0, "gpus": 0.0, "kv_blocks": 0.0}
    for deployment in deployments:
        revision = deployment.current_revision
        if revision is None or deployment.deleted_at is not None:
            continue
        for key, value in spec_usage(spec=revision.spec()).items():
            total[key] += value
    return total
