"""The cost panels of the new-deployment, scale and canary forms: htmx posts the form as it
changes and gets back what the deployment would hold against the tenant's quota and whether
the cluster can place it (serving.deployments.cost); nothing is written."""

from __future__ import annotations

from typing import Any

from django import forms as django_forms
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from serving.deployments import cost, forms
from serving.deployments import selectors as deployment_selectors
from serving.deployments.views import canary_versions, ready_versions
from tenants.models import Scope, Tenant
from tenants.pages import tenant_page

NOT_COSTED = ("name", "description")  # fields the cost does not depend on


@require_POST
@tenant_page(Scope.DEPLOY)
def deployment_cost(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = forms.DeploymentCreateForm(request.POST, versions=ready_versions(tenant))
    return _cost_panel(
        request,
        form,
        lambda: cost.new_deployment_cost(
            tenant=tenant, version_id=form.cleaned_data["version"].pk, settings=form.settings()
        ),
    )


@require_POST
@tenant_page(Scope.DEPLOY)
def deployment_change_cost(
    request: HttpRequest, tenant: Tenant, pk: int, form: str
) -> HttpResponse:
    """The scale form's (`form=scale`) or the canary form's (`form=canary`) cost panel."""
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    changing: forms.DeploymentSettingsForm | forms.CanaryForm
    if form == "scale":
        changing = forms.DeploymentSettingsForm(request.POST)
    elif form == "canary":
        changing = forms.CanaryForm(request.POST, versions=canary_versions(tenant, deployment))
    else:
        raise Http404("No such form.")

    def changes() -> dict[str, Any]:
        if isinstance(changing, forms.CanaryForm):
            return changing.changes()
        return changing.settings()

    return _cost_panel(
        request,
        changing,
        lambda: cost.deployment_change_cost(
            tenant=tenant, deployment=deployment, changes=changes()
        ),
    )


def _cost_panel(request: HttpRequest, form: django_forms.Form, work: Any) -> HttpResponse:
    """The form's problems (by field label), else the cost `work()` computes; a refusal the
    services would give is shown as a problem of the field it names."""
    form.is_valid()
    problems = [
        f"{form[name].label if name in form.fields else name}: {' '.join(errors)}"
        for name, errors in form.errors.items()
        if name not in NOT_COSTED
    ]
    context: dict[str, object] = {"problems": problems}
    if not problems:
        try:
            context["cost"] = work()
        except PortalError as exc:
            field = exc.field or ""
            error_field = getattr(form, "error_field", None)
            field = (error_field(field) if error_field else None) or field
            label = form[field].label if field in form.fields else field
            context["problems"] = [f"{label}: {exc.message}" if label else exc.message]
    return render(request, "serving/_deployment_cost.html", context)
