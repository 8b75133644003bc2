"""Pages of the tenant's own cause rules: the list (with how many recent incidents each would
have matched) and a form to add one, a rule's edit form, its switch and its removal. Writers
change, viewers read. The checks are the services' (the API's too): the form only turns text
into numbers, and a service error lands on the field it names."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from incidents import selectors, services
from incidents.models import CauseRule, RuleOp
from incidents.rca.evidence import SIGNAL_NAMES
from incidents.rca.rule_matches import (
    WINDOW,
    rule_match_counts,
    rule_matches_throttle,
)
from incidents.rca.services import RULE_FIELDS
from portal.exceptions import PortalError, RateLimited
from tenants.models import Scope, Tenant
from tenants.pages import can_write, form_error, page_actor, tenant_page, throttled_page
from tenants.scoping import get_for_tenant

MATCHES_TEMPLATE = "incidents/_cause_rules_table.html"

NUMBER = forms.NumberInput(attrs={"step": "any"})


class CauseRuleForm(forms.Form):
    # Plain text behind the selects: the service says what is allowed (the API's check).
    symptom = forms.CharField(
        required=False,
        label="Symptom (signal)",
        widget=forms.Select(choices=[("", "Choose a signal"), *((n, n) for n in SIGNAL_NAMES)]),
    )
    op = forms.CharField(
        required=False, label="Operator", widget=forms.Select(choices=RuleOp.choices)
    )
    threshold = forms.FloatField(
        required=False, widget=NUMBER, help_text="blank for the operator “is true”"
    )
    cause = forms.CharField(required=False, label="Likely cause")
    fix = forms.CharField(
        required=False, label="Suggested fix", widget=forms.Textarea(attrs={"rows": 2})
    )
    weight = forms.FloatField(
        required=False, initial=1.0, widget=NUMBER, help_text="0 to 10; blank for 1"
    )
    is_active = forms.BooleanField(required=False, initial=True, label="Active")

    def rule_fields(self) -> dict[str, Any]:
        """The cleaned fields as the services take them (a blank weight is left out)."""
        data = dict(self.cleaned_data)
        if data.get("weight") is None:
            data.pop("weight", None)
        return data


def _initial(rule: CauseRule) -> dict[str, Any]:
    return {name: getattr(rule, name) for name in RULE_FIELDS}


def _rule(tenant: Tenant, pk: int) -> CauseRule:
    return get_for_tenant(selectors.cause_rule_list(tenant=tenant), tenant=tenant, pk=pk)


@require_http_methods(["GET", "POST"])
@tenant_page()
def cause_rules_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = CauseRuleForm(request.POST or None)
    if request.method == "POST":
        if not can_write(request):
            messages.error(request, "Your role cannot add cause rules.")
            return redirect("cause-rules", slug=tenant.slug)
        if form.is_valid():
            try:
                rule = services.cause_rule_create(
                    tenant=tenant, actor=page_actor(request), **form.rule_fields()
                )
            except PortalError as exc:
                form_error(form, exc)
            else:
                messages.success(request, f"Rule added: {rule.symptom} → {rule.cause}.")
                return redirect("cause-rules", slug=tenant.slug)
    context = {
        "form": form,
        "rows": [(rule, None) for rule in selectors.cause_rule_list(tenant=tenant).order_by("id")],
        "matches": None,  # counted by the fragment below, loaded once the page shows
        "window_days": WINDOW.days,
        "can_write": can_write(request),
    }
    return render(request, "incidents/cause_rules.html", context)


@require_GET
@tenant_page()
def cause_rule_matches(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The rules' table with how many recent incidents each would have matched (the costly
    part: each incident's signals, cached once it is resolved). Bounded per tenant: a load
    past RULE_MATCHES_PER_MINUTE, or one that waited too long for the tenant's running count,
    gets the table without counts and a 429 with Retry-After (a 200 for htmx, which swaps
    only 2xx; the fragment then loads itself again after Retry-After)."""
    rules = list(selectors.cause_rule_list(tenant=tenant).order_by("id"))
    try:
        rule_matches_throttle(tenant=tenant)
        matches = rule_match_counts(tenant=tenant, rules=rules)
    except RateLimited as exc:
        # The table without counts, saying why; it loads itself again after Retry-After.
        context = {
            "rows": [(rule, None) for rule in rules],
            "matches": None,
            "window_days": WINDOW.days,
            "can_write": can_write(request),
            "refused": exc.message,
        }
        response = throttled_page(request, MATCHES_TEMPLATE, context, exc.wait)
        if request.headers.get("HX-Request"):
            response.status_code = 200  # htmx swaps only 2xx answers (Retry-After stays)
        return response
    context = {
        "rows": [(rule, matches.counts.get(rule.pk, 0)) for rule in rules],
        "matches": matches,
        "window_days": WINDOW.days,
        "can_write": can_write(request),
    }
    return render(request, MATCHES_TEMPLATE, context)


@require_http_methods(["GET", "POST"])
@tenant_page(Scope.WRITE)
def cause_rule_edit(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    rule = _rule(tenant, pk)
    form = CauseRuleForm(request.POST or None, initial=_initial(rule))
    if request.method == "POST" and form.is_valid():
        try:
            services.cause_rule_update(
                tenant=tenant, actor=page_actor(request), rule=rule, changes=form.rule_fields()
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            messages.success(request, f"Rule {rule.pk} saved.")
            return redirect("cause-rules", slug=tenant.slug)
    return render(request, "incidents/cause_rule_edit.html", {"form": form, "rule": rule})


@require_POST
@tenant_page(Scope.WRITE)
def cause_rule_switch(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    rule = _rule(tenant, pk)
    try:
        rule = services.cause_rule_update(
            tenant=tenant,
            actor=page_actor(request),
            rule=rule,
            changes={"is_active": not rule.is_active},
        )
    except PortalError as exc:  # a rule older than today's checks: edit it first
        field = f"{exc.field}: " if exc.field else ""
        messages.error(request, f"Rule {rule.pk} not switched: {field}{exc.message}")
    else:
        state = "on" if rule.is_active else "off"
        messages.success(request, f"Rule {rule.pk} ({rule.cause}) switched {state}.")
    return redirect("cause-rules", slug=tenant.slug)


@require_POST
@tenant_page(Scope.WRITE)
def cause_rule_delete(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    rule = _rule(tenant, pk)
    services.cause_rule_delete(tenant=tenant, actor=page_actor(request), rule=rule)
    messages.success(request, f"Rule {pk} ({rule.cause}) removed.")
    return redirect("cause-rules", slug=tenant.slug)
