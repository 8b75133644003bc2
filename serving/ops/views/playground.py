"""The deployment playground page: a writer tries a prompt on the stable slot, the canary, or
both side by side (serving.ops.playground); htmx posts the form and swaps the form and results
panel, a plain POST gets the whole page."""

from __future__ import annotations

import math
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from portal.exceptions import PortalError, RateLimited
from serving.deployments import selectors as deployment_selectors
from serving.deployments.models import Deployment
from serving.ops import playground, playground_limits
from serving.ops.forms import PlaygroundForm
from serving.ops.health.targets import PROBE_STATUSES
from tenants.models import Scope, Tenant
from tenants.pages import form_error, tenant_page


def _form(limits: playground_limits.PlaygroundLimits, data: Any = None) -> PlaygroundForm:
    return PlaygroundForm(
        data, max_prompt_chars=limits.max_prompt_chars, max_tokens=limits.max_tokens
    )


def _render(
    request: HttpRequest,
    deployment: Deployment,
    limits: playground_limits.PlaygroundLimits,
    form: PlaygroundForm,
    *,
    answers: list[playground.ArmAnswer] | None = None,
    status: int = 200,
) -> HttpResponse:
    revision = deployment.current_revision
    context = {
        "d": deployment,
        "form": form,
        "limits": limits,
        "answers": answers or [],
        "serving": deployment.status in PROBE_STATUSES,
        "stable_version": playground.version_label(revision.stable_version if revision else None),
        "canary_version": playground.version_label(revision.canary_version if revision else None),
    }
    if request.headers.get("HX-Request"):
        # htmx swaps only 2xx answers: a refusal is shown in the panel with a 200.
        return render(request, "serving/ops/_playground.html", context)
    return render(request, "serving/ops/playground.html", context, status=status)


@require_http_methods(["GET", "POST"])
@tenant_page(Scope.DEPLOY)
def playground_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    limits = playground_limits.playground_limits(deployment=deployment)
    if request.method == "GET":
        return _render(request, deployment, limits, _form(limits))
    form = _form(limits, request.POST)
    if not form.is_valid():
        return _render(request, deployment, limits, form, status=400)
    try:
        # The tenant's slot first: a run refused because the tenant's runs are all answering
        # costs neither the member's nor the tenant's bucket.
        with playground_limits.playground_slot(tenant=tenant, limits=limits):
            _charge(tenant, request.user.pk, limits)
            answers = playground.playground_run(
                deployment=deployment, limits=limits, **form.cleaned_data
            )
    except RateLimited as exc:
        form_error(form, exc)
        response = _render(request, deployment, limits, form, status=exc.status_code)
        response["Retry-After"] = str(max(1, math.ceil(exc.wait)))
        return response
    except PortalError as exc:
        form_error(form, exc)
        return _render(request, deployment, limits, form, status=exc.status_code)
    return _render(request, deployment, limits, form, answers=answers)


def _charge(tenant: Tenant, user_id: int, limits: playground_limits.PlaygroundLimits) -> None:
    wait = playground_limits.playground_throttle(tenant=tenant, user_id=user_id, limits=limits)
    RateLimited.unless_ready(
        wait,
        f"Too many playground runs (at most {limits.per_minute} a minute per member and "
        f"{limits.tenant_per_minute} a minute for the tenant)",
    )
