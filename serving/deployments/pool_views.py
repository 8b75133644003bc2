"""The shared pools page: for a tenant, each pool the platform lets it use, its fair share
there (KV blocks, sequences and requests at once, over all the pool's replicas), and which of
its deployments run on it with what they use now; staff also see every pool, the tenants
allowed on it, and manage them on /platform/pools/ (through `pool_save`, as the admin)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from portal.exceptions import PortalError
from serving.deployments import selectors
from serving.deployments.models import SharedPool
from serving.deployments.pool_forms import PoolForm
from serving.deployments.services import pool_save
from tenants.actors import Actor
from tenants.models import Quota, Tenant
from tenants.pages import form_error, tenant_page


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


@require_http_methods(["GET", "POST"])
@staff_member_required
def pool_edit(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    """Platform staff create (no `pk`) or change a shared pool and the tenants granted to it."""
    pool = get_object_or_404(SharedPool, pk=pk) if pk is not None else None
    form = PoolForm(request.POST or None, instance=pool)
    if request.method == "POST" and form.is_valid():
        try:
            saved = pool_save(
                pool=form.pool(),
                actor=Actor(user=request.user),
                allowed_tenants=form.cleaned_data["allowed_tenants"],
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            messages.success(request, f"Pool {saved.name} saved.")
            return redirect("platform-pool", pk=saved.pk)
    every = SharedPool.objects.select_related("model_version__model").order_by("name")
    return render(request, "serving/pool_edit.html", {"form": form, "pool": pool, "every": every})
