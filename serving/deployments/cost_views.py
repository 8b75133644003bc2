"""The new-deployment form's cost panel: htmx posts the form as it changes and gets back what
the deployment would hold against the tenant's quota and whether the cluster can place it
(serving.deployments.cost); nothing is written."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from serving.deployments import cost, forms
from serving.deployments.views import ready_versions
from tenants.models import Scope, Tenant
from tenants.pages import tenant_page

NOT_COSTED = ("name", "description")  # fields the cost does not depend on


@require_POST
@tenant_page(Scope.DEPLOY)
def deployment_cost(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = forms.DeploymentCreateForm(request.POST, versions=ready_versions(tenant))
    form.is_valid()
    problems = [
        f"{form[name].label if name in form.fields else name}: {' '.join(errors)}"
        for name, errors in form.errors.items()
        if name not in NOT_COSTED
    ]
    context: dict[str, object] = {"problems": problems}
    if not problems:
        try:
            context["cost"] = cost.new_deployment_cost(
                tenant=tenant, version_id=form.cleaned_data["version"].pk, settings=form.settings()
            )
        except PortalError as exc:
            field = exc.field or ""
            label = form[field].label if field in form.fields else field
            context["problems"] = [f"{label}: {exc.message}" if label else exc.message]
    return render(request, "serving/_deployment_cost.html", context)
