"""Pages of incidents: the list (filters, open first) and the detail (status actions, timeline,
breaches, rollback, ranked hints, notes, postmortem). Both stay current through the tenant's
incident stream (incidents.consumers): on an event the page re-fetches the fragment it shows."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from incidents import analytics, selectors, services
from incidents.breach_views import deployment_choices
from incidents.models import Incident, IncidentStatus, Severity
from incidents.rca import selectors as rca
from incidents.rca.learning import cause_key
from incidents.rca.models import Verdict
from incidents.rca.postmortem import postmortem_markdown
from incidents.rca.services_feedback import hint_feedback_set
from incidents.rca.similar import similar_incidents
from portal.exceptions import PortalError
from portal.filters import DayRangeForm, by_days
from tenants.actors import Actor
from tenants.models import Scope, Tenant
from tenants.pages import can_write, tenant_page
from tenants.scoping import get_for_tenant

PAGE_SIZE = 50
OPEN = "open"
# The status buttons: action -> (target status, service, button label).
ACTIONS = {
    "acknowledge": (IncidentStatus.ACKNOWLEDGED, services.incident_acknowledge, "Acknowledge"),
    "mitigate": (IncidentStatus.MITIGATED, services.incident_mitigate, "Mark mitigated"),
    "resolve": (IncidentStatus.RESOLVED, services.incident_resolve, "Resolve"),
}


class NoteForm(forms.Form):
    text = forms.CharField(
        label="Note",
        max_length=services.NOTE_MAX_CHARS,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "What you saw or did"}),
    )


class FilterForm(DayRangeForm):
    status = forms.ChoiceField(
        required=False, choices=[("", "Any status"), (OPEN, "Open"), *IncidentStatus.choices]
    )
    severity = forms.ChoiceField(required=False, choices=[("", "Any severity"), *Severity.choices])
    deployment = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    kind = forms.ChoiceField(
        required=False, choices=[("", "Real and drills"), ("real", "Real"), ("drill", "Drills")]
    )


def _filtered(tenant: Tenant, params: Any) -> tuple[FilterForm, QuerySet[Incident]]:
    """The tenant's incidents matching the filters, open ones first, newest first within:
    status, severity, one of the tenant's deployments, real or drill, triggered from / to a
    day (UTC, both included)."""
    form = FilterForm(params)
    form.fields["deployment"].choices = deployment_choices(tenant)
    incidents = selectors.incident_list(tenant=tenant).annotate(
        closed=Case(
            When(status=IncidentStatus.RESOLVED, then=Value(1)),
            default=Value(0),
            output_field=IntegerField(),
        )
    )
    if form.is_valid():
        status, severity = form.cleaned_data["status"], form.cleaned_data["severity"]
        if status == OPEN:
            incidents = incidents.exclude(status=IncidentStatus.RESOLVED)
        elif status:
            incidents = incidents.filter(status=status)
        if severity:
            incidents = incidents.filter(severity=severity)
        data = form.cleaned_data
        if data["deployment"] is not None:
            incidents = incidents.filter(deployment_id=data["deployment"])
        if data["kind"]:
            incidents = incidents.filter(is_drill=data["kind"] == "drill")
        incidents = by_days(incidents, "triggered_at", data)
    else:  # a filter that makes no sense finds nothing, and says which (the form's errors)
        incidents = incidents.none()
    return form, incidents.order_by("closed", "-triggered_at", "-id")


def _list_context(request: HttpRequest, tenant: Tenant) -> dict[str, Any]:
    form, incidents = _filtered(tenant, request.GET)
    page = Paginator(incidents, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return {"filter_form": form, "page": page, "query": query.urlencode()}


@require_GET
@tenant_page()
def incident_list_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    return render(request, "incidents/list.html", _list_context(request, tenant))


@require_GET
@tenant_page()
def incident_table(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The list's table with the same filters: re-fetched when an incident not shown changes
    (a new one opened)."""
    return render(request, "incidents/_table.html", _list_context(request, tenant))


@require_GET
@tenant_page()
def incident_row(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """One row of the list: re-fetched when that incident changes."""
    incident = selectors.incident_get(tenant=tenant, incident_id=pk)
    return render(request, "incidents/_row.html", {"i": incident})


def _get(tenant: Tenant, pk: int) -> Incident:
    """One incident with its timeline, breaches and rollback; foreign or missing is a 404."""
    incidents = selectors.incident_detail_list(tenant=tenant).select_related(
        "rollback__from_revision", "rollback__to_revision", "rollback__new_revision"
    )
    return get_for_tenant(incidents, tenant=tenant, pk=pk)


def _live_context(request: HttpRequest, incident: Incident) -> dict[str, Any]:
    reachable = services.NEXT.get(incident.status, set())
    return {
        "i": incident,
        "events": list(incident.events.all()),
        "breaches": list(incident.breaches.all()),
        "rollback": incident.rollback,
        "actions": [
            {"name": name, "label": label}
            for name, (status, _, label) in ACTIONS.items()
            if status in reachable
        ],
        "can_write": can_write(request),
    }


def _detail(
    request: HttpRequest, tenant: Tenant, incident: Incident, *, note_form: NoteForm | None = None
) -> HttpResponse:
    analysis = rca.incident_analysis(
        tenant=tenant, incident=incident, user_id=Actor(user=request.user).user_id
    )
    causes = [h.cause for h in analysis.hints]
    context = {
        **_live_context(request, incident),
        "hints": [(h, analysis.my_votes.get(cause_key(h.cause), "")) for h in analysis.hints],
        "muted": [(h, analysis.my_votes.get(cause_key(h.cause), "")) for h in analysis.muted],
        "symptoms": analysis.symptoms,
        "similar": similar_incidents(tenant=tenant, incident=incident, causes=causes),
        "signals": sorted(analysis.signals.items()),
        "note_form": note_form or NoteForm(),
    }
    return render(request, "incidents/detail.html", context)


@require_GET
@tenant_page()
def incident_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    return _detail(request, tenant, _get(tenant, pk))


@require_GET
@tenant_page()
def incident_live(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """The changing part of the detail page (status, actions, timeline, breaches, rollback)."""
    incident = _get(tenant, pk)
    return render(request, "incidents/_live.html", _live_context(request, incident))


@require_POST
@tenant_page(Scope.WRITE)
def incident_action(request: HttpRequest, tenant: Tenant, pk: int, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404("No such action.")
    incident = selectors.incident_get(tenant=tenant, incident_id=pk)
    _, service, _ = ACTIONS[action]
    try:
        moved = service(tenant=tenant, actor=Actor(user=request.user), incident=incident)
    except PortalError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Incident #{moved.pk} is {moved.get_status_display().lower()}.")
    return redirect("incident-detail", slug=tenant.slug, pk=incident.pk)


@require_POST
@tenant_page(Scope.WRITE)
def incident_note(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    incident = _get(tenant, pk)
    form = NoteForm(request.POST)
    if form.is_valid():
        try:
            services.incident_note(
                tenant=tenant,
                actor=Actor(user=request.user),
                incident=incident,
                text=form.cleaned_data["text"],
            )
        except PortalError as exc:
            form.add_error("text", exc.message)
        else:
            messages.success(request, "Note added.")
            return redirect("incident-detail", slug=tenant.slug, pk=incident.pk)
    return _detail(request, tenant, incident, note_form=form)


@require_POST
@tenant_page(Scope.WRITE)
def incident_hint_feedback(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """A member's "right / wrong" on one hint (the same button again takes it back)."""
    incident = selectors.incident_get(tenant=tenant, incident_id=pk)
    verdict = request.POST.get("verdict", "")
    if verdict not in Verdict.values:
        verdict = ""
    try:
        weight = hint_feedback_set(
            tenant=tenant,
            actor=Actor(user=request.user),
            incident=incident,
            cause=request.POST.get("cause", "")[:200],
            verdict=verdict,
        )
    except PortalError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request, f"Thanks: {weight.cause!r} now weighs x{weight.multiplier:.2f} here."
        )
    return redirect("incident-detail", slug=tenant.slug, pk=incident.pk)


@require_GET
@tenant_page()
def incident_analytics_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """Incidents per week by severity, MTTD / MTTR (real and drills), availability."""
    weeks = _int(request.GET.get("weeks"), 12)
    days = _int(request.GET.get("days"), 7)
    data = analytics.incident_analytics(tenant=tenant, weeks=weeks, window_days=days)
    timings = []
    for label, figures in data["timings"].items():
        for key, name in (("mttd", "Time to detect"), ("mttr", "Time to restore")):
            got = figures[key]
            p50, p95 = _seconds(got["p50_s"]), _seconds(got["p95_s"])
            timings.append((label, figures["incidents"], name, got["n"], p50, p95))
    return render(request, "incidents/analytics.html", {"a": data, "timings": timings})


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min" if value < 7200 else f"{value / 3600:.1f} h"


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value else default
    except ValueError:
        return default


@require_GET
@tenant_page()
def incident_postmortem(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    incident = selectors.incident_get(tenant=tenant, incident_id=pk)
    text = postmortem_markdown(tenant=tenant, incident=incident)
    response = HttpResponse(text, content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="incident-{incident.pk}.md"'
    return response
