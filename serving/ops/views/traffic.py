"""The split-consistency panel of a deployment (serving.ops.split): loaded into the deployment's
page and polled, it shows per client (a salted hash, never the key) whether it always saw the
same group, and the observed split against the configured one; POST sets the deployment's
`traffic` (sticky by client key) as a new revision."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from portal.exceptions import PortalError
from serving.deployments import selectors as deployment_selectors
from serving.deployments import services as deployment_services
from serving.ops.split import split_consistency
from serving.ops.views.health import require_deploy
from tenants.models import Tenant
from tenants.pages import can_deploy, page_actor, tenant_page


@require_http_methods(["GET", "POST"])
@tenant_page()
def split_panel(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    if request.method == "GET":
        context = {
            "d": deployment,
            "split": split_consistency(deployment=deployment),
            "traffic": (deployment.current_revision.traffic or {})
            if deployment.current_revision
            else {},
            "can_deploy": can_deploy(request),
        }
        live = request.GET.get("live") == "1"  # the polled part alone
        return render(request, f"serving/ops/_split{'_live' if live else ''}.html", context)
    require_deploy(request)
    traffic = {
        "sticky": request.POST.get("sticky") == "on",
        "user_field": request.POST.get("user_field") == "on",
        "client_key_header": request.POST.get("client_key_header", "")[:200].strip()
        or "x-client-key",
    }
    try:
        deployment_services.deployment_change(
            tenant=tenant,
            actor=page_actor(request),
            deployment=deployment,
            changes={"traffic": traffic},
            reason="sticky split on" if traffic["sticky"] else "sticky split off",
        )
    except PortalError as exc:
        field = f" ({exc.field})" if exc.field else ""
        messages.error(request, f"Traffic not changed{field}: {exc.message}")
    else:
        messages.success(request, "Traffic settings saved: the routers take them without restart.")
    return redirect("serving-deployment", slug=tenant.slug, pk=deployment.pk)
