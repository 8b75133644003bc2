"""Pages of chaos drills: the catalogue and the tenant's drills, a form to create one (errors
next to their fields), a drill with its runs (start, schedule), a run's live view
(status, timeline, MTTD/MTTR, probes, the deployment's SLI chart) that ends as its report, and
the "Run a drill" fragment the tenant overview loads by htmx (tenants never imports incidents)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from incidents import drills
from incidents.drills.forms import DrillForm
from incidents.drills.models import (
    ACTIVE_STATUSES,
    ChaosDrill,
    DrillRun,
)
from portal.exceptions import PortalError
from serving.deployments import selectors as deployment_selectors
from tenants.actors import Actor
from tenants.models import Scope, Tenant
from tenants.pages import can_deploy, tenant_page
from tenants.scoping import get_for_tenant

JSON_FIELDS = ("parameters", "steady_state", "abort_conditions")


def _require_deploy(request: HttpRequest) -> None:
    if Scope.DEPLOY not in request.membership.scopes:  # type: ignore[attr-defined]
        raise PermissionDenied("Your role cannot run drills.")


@require_GET
@tenant_page()
def drills_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    context = {
        "catalogue": drills.catalogue(),
        "drills": ChaosDrill.objects.filter(tenant=tenant).select_related("deployment"),
        "runs": DrillRun.objects.filter(tenant=tenant).select_related("drill")[:20],
        "can_deploy": Scope.DEPLOY in request.membership.scopes,  # type: ignore[attr-defined]
    }
    return render(request, "incidents/drills/list.html", context)


QUICK_DRILLS = 3  # the overview offers the newest few; the drills page lists them all


@require_GET
@tenant_page()
def drill_quick(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The overview's "Run a drill" card: the newest active drills, each with a button that
    starts a run (members who may deploy) or a link to the run already in progress."""
    quick = list(
        ChaosDrill.objects.filter(
            tenant=tenant, is_active=True, deployment__deleted_at__isnull=True
        )
        .select_related("deployment")
        .order_by("-created_at", "-pk")[:QUICK_DRILLS]
    )
    running = (
        dict(
            DrillRun.objects.filter(tenant=tenant, drill__in=quick, status__in=ACTIVE_STATUSES)
            .order_by("created_at")
            .values_list("drill_id", "pk")
        )
        if quick
        else {}
    )
    rows = [{"drill": drill, "run_id": running.get(drill.pk)} for drill in quick]
    context = {"rows": rows, "can_deploy": can_deploy(request)}
    return render(request, "incidents/drills/_quick.html", context)


@require_http_methods(["GET", "POST"])
@tenant_page(Scope.DEPLOY)
def drill_new(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    choices = [
        (d.pk, d.name) for d in deployment_selectors.deployment_list(tenant=tenant).order_by("name")
    ]
    form = DrillForm(request.POST or None)
    form.fields["deployment"].choices = choices
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        deployment = get_for_tenant(
            deployment_selectors.deployment_list(tenant=tenant),
            tenant=tenant,
            pk=data.pop("deployment"),
        )
        try:
            drill = drills.drill_create(
                tenant=tenant, actor=Actor(user=request.user), deployment=deployment, **data
            )
        except PortalError as exc:
            field = form.field_of(exc.field or "")
            form.add_error(field, exc.message if field else _message(exc))
        else:
            messages.success(request, f"Drill {drill.name} created.")
            return redirect("drill-detail", slug=tenant.slug, pk=drill.pk)
    return render(request, "incidents/drills/new.html", {"form": form})


def _message(exc: PortalError) -> str:
    return f"{exc.field}: {exc.message}" if exc.field and "." in exc.field else exc.message


@require_GET
@tenant_page()
def drill_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    drill = get_for_tenant(ChaosDrill.objects.select_related("deployment"), tenant=tenant, pk=pk)
    context = {
        "drill": drill,
        "runs": drill.runs.all()[:50],
        "can_deploy": Scope.DEPLOY in request.membership.scopes,  # type: ignore[attr-defined]
        "pretty": {f: json.dumps(getattr(drill, f), indent=1) for f in JSON_FIELDS},
    }
    return render(request, "incidents/drills/detail.html", context)


@require_POST
@tenant_page(Scope.DEPLOY)
def drill_run_start(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    drill = get_for_tenant(ChaosDrill.objects.select_related("deployment"), tenant=tenant, pk=pk)
    try:
        run = drills.run_start(tenant=tenant, actor=Actor(user=request.user), drill=drill)
    except PortalError as exc:
        messages.error(request, exc.message)
        return redirect("drill-detail", slug=tenant.slug, pk=drill.pk)
    return redirect("drill-run", slug=tenant.slug, pk=run.pk)


def _run(tenant: Tenant, pk: int) -> DrillRun:
    return get_for_tenant(
        DrillRun.objects.select_related("drill", "deployment", "incident"), tenant=tenant, pk=pk
    )


@require_GET
@tenant_page()
def drill_run_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    return render(request, "incidents/drills/run.html", _run_context(request, tenant, pk))


def _run_context(request: HttpRequest, tenant: Tenant, pk: int) -> dict[str, Any]:
    return {
        "run": _run(tenant, pk),
        "can_deploy": Scope.DEPLOY in request.membership.scopes,  # type: ignore[attr-defined]
    }


@require_GET
@tenant_page()
def drill_run_live(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """The run's status, figures and timeline (htmx, every second while it is active)."""
    return render(request, "incidents/drills/_run_live.html", _run_context(request, tenant, pk))


@require_POST
@tenant_page(Scope.DEPLOY)
def drill_run_stop(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    try:
        drills.run_stop(tenant=tenant, actor=Actor(user=request.user), run=_run(tenant, pk))
    except PortalError as exc:
        messages.error(request, exc.message)
    return redirect("drill-run", slug=tenant.slug, pk=pk)
