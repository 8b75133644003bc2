"""The shared pools page: for a tenant, each pool the platform lets it use, its fair share
there (KV blocks, sequences and requests at once, over all the pool's replicas), and which of
its deployments run on it with what they use now; staff also see every pool, the tenants
allowed on it, and manage them (the admin's pool form goes through `pool_save`)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from serving.deployments import selectors
from serving.deployments.models import SharedPool
from tenants.models import Quota, Tenant
from tenants.pages import tenant_page


def _mine(tenant: Tenant) -> list[dict[str, Any]]:
    plan = Quota.objects.filter(tenant=tenant).values_list("max_kv_blocks", flat=True).first()
    pools = SharedPool.objects.filter(is_active=True, allowed_tenants=tenant).select_related(
        "model_version__model"
    )
    on_pool: dict[int, list[dict[str, Any]]] = {}
    for d in selectors.deployment_list(tenant=tenant):
        revision = d.current_revision
        if revision is not None and revision.pool_id is not None:
            use = selectors.deployment_pool_share(tenant=tenant, deployment=d)
            on_pool.setdefault(revision.pool_id, []).append({"d": d, "use": use})
    rows = []
    for pool in pools.order_by("name"):
        share = selectors.pool_share(pool, plan or 0)
        rows.append(
            {
                "pool": pool,
                "blocks": share.quota_blocks * pool.num_replicas,
                "sequences": share.max_running * pool.num_replicas,
                "requests": share.request_slots,
                "deployments": on_pool.get(pool.pk, []),
            }
        )
    return rows


@require_GET
@tenant_page()
def pools_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    staff = bool(getattr(request.user, "is_staff", False))
    every = (
        SharedPool.objects.select_related("model_version__model")
        .annotate(tenants=Count("allowed_tenants"))
        .order_by("name")
        if staff
        else None
    )
    return render(request, "serving/pools.html", {"mine": _mine(tenant), "every": every})
