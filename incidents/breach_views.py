"""Firing alerts and breach history (issue 19, item 4): what fires now on each deployment (the
last health tick's findings, one Redis read) and every recorded SLA breach, filtered by
deployment, objective, severity, kind and day, newest first, each linked to its incident."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from redis.exceptions import RedisError

from incidents import selectors
from incidents.models import BreachKind, Severity, SlaBreach
from portal.filters import DayRangeForm, by_days
from serving.deployments import selectors as deployment_selectors
from serving.ops import selectors as ops_selectors
from tenants.models import Tenant
from tenants.pages import tenant_page

PAGE_SIZE = 50


class BreachFilterForm(DayRangeForm):
    deployment = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    objective = forms.CharField(required=False, max_length=120)
    severity = forms.ChoiceField(required=False, choices=[("", "Any severity"), *Severity.choices])
    kind = forms.ChoiceField(required=False, choices=[("", "Any kind"), *BreachKind.choices])


def _filtered(tenant: Tenant, params: Any) -> tuple[BreachFilterForm, QuerySet[SlaBreach]]:
    form = BreachFilterForm(params)
    form.fields["deployment"].choices = deployment_choices(tenant)
    rows = selectors.breach_list(tenant=tenant).select_related("deployment", "incident")
    rows = rows.order_by("-detected_at", "-id")
    if not form.is_valid():
        return form, rows.none()
    data = form.cleaned_data
    if data["deployment"] is not None:
        rows = rows.filter(deployment_id=data["deployment"])
    if data["objective"].strip():
        rows = rows.filter(objective=data["objective"].strip())
    if data["severity"]:
        rows = rows.filter(severity=data["severity"])
    if data["kind"]:
        rows = rows.filter(kind=data["kind"])
    return form, by_days(rows, "detected_at", data)


def deployment_choices(tenant: Tenant) -> list[tuple[Any, str]]:
    """The list filters' deployment choices: the tenant's own, deleted ones marked."""
    names = deployment_selectors.deployment_list(tenant=tenant, include_deleted=True)
    return [("", "Any deployment")] + [
        (pk, f"{name} (deleted)" if gone else name)
        for pk, name, gone in names.order_by("name", "pk").values_list("pk", "name", "deleted_at")
    ]


def _firing(tenant: Tenant) -> tuple[list[dict[str, Any]], bool]:
    """What fires now, per deployment and slot, from the last tick; False when Redis is away."""
    deployments = list(deployment_selectors.deployment_list(tenant=tenant))
    try:
        found = ops_selectors.deployments_health([d.pk for d in deployments])
    except RedisError:
        return [], False
    rows = []
    for d in deployments:
        for group, evaluation in sorted(((found.get(d.pk) or {}).get("slots") or {}).items()):
            alerts = evaluation.get("firing") or []
            rows.extend({"deployment": d, "group": group, **alert} for alert in alerts)
    return rows, True


@require_GET
@tenant_page()
def breaches_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form, rows = _filtered(tenant, request.GET)
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    firing, known = _firing(tenant)
    context = {"filter_form": form, "page": page, "query": query.urlencode()}
    return render(
        request, "incidents/breaches.html", {**context, "firing": firing, "firing_known": known}
    )
