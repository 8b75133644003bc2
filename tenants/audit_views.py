"""The audit log page: filters (action prefix, who, object type, from / to a day) and the same
rows as CSV (`?format=csv`), streamed, at most EXPORT_MAX_ROWS of them, newest first.

A cell a spreadsheet would take for a formula (it starts with =, +, -, @, a tab or a carriage
return) is written with a leading apostrophe: names, descriptions and reprs in the log are
chosen by tenants, and an export must not run anything in the reader's spreadsheet."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import Any

from django import forms
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from portal.filters import DayRangeForm, by_days
from tenants import selectors
from tenants.models import AuditEvent, Tenant
from tenants.pages import tenant_page

PAGE_SIZE = 50
EXPORT_MAX_ROWS = 50_000
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
COLUMNS = ("when", "who", "action", "object_type", "object_id", "object", "before", "after")


class AuditFilterForm(DayRangeForm):
    action = forms.CharField(required=False, max_length=80, label="Action starts with")
    actor = forms.CharField(required=False, max_length=200, label="Who")
    object_type = forms.CharField(
        required=False, max_length=80, label="Object type", help_text="e.g. serving.deployment"
    )


def filtered(tenant: Tenant, params: Any) -> tuple[AuditFilterForm, QuerySet[AuditEvent]]:
    """The tenant's audit events matching the filters, newest first; none when a filter is
    not valid (the form says which)."""
    form = AuditFilterForm(params)
    events = selectors.audit_event_list(tenant=tenant).order_by("-id")
    if not form.is_valid():
        return form, events.none()
    data = form.cleaned_data
    if data["action"].strip():
        events = events.filter(action__startswith=data["action"].strip())
    if data["actor"].strip():
        events = events.filter(actor_label__icontains=data["actor"].strip())
    if data["object_type"].strip():
        events = events.filter(object_type=data["object_type"].strip())
    return form, by_days(events, "created_at", data)


def safe_cell(value: Any) -> str:
    """A CSV cell a spreadsheet shows as text, never evaluates."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return "'" + text if text.startswith(FORMULA_START) else text


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_rows(events: QuerySet[AuditEvent]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(COLUMNS)
    for e in events[:EXPORT_MAX_ROWS].iterator(chunk_size=1000):
        yield writer.writerow(
            [
                e.created_at.isoformat(),
                safe_cell(e.actor_label),
                safe_cell(e.action),
                safe_cell(e.object_type),
                safe_cell(e.object_id),
                safe_cell(e.object_repr),
                "" if e.before is None else safe_cell(e.before),
                "" if e.after is None else safe_cell(e.after),
            ]
        )


@require_GET
@tenant_page()
def audit_log(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form, events = filtered(tenant, request.GET)
    if request.GET.get("format") == "csv":
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        response = StreamingHttpResponse(_csv_rows(events), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="audit-{tenant.slug}-{stamp}.csv"'
        return response
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    query.pop("format", None)
    return render(
        request,
        "tenants/audit.html",
        {
            "page": page,
            "filter_form": form,
            "query": query.urlencode(),
            "max_rows": EXPORT_MAX_ROWS,
        },
    )
