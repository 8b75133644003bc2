"""The request inspector's page of one deployment and its live part (htmx, every 5 s)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal.exceptions import ValidationFailed
from serving.deployments import selectors as deployment_selectors
from serving.telemetry import inspector
from tenants.models import Tenant
from tenants.pages import tenant_page

MAX_QUERY = 200  # characters of `q` echoed back into the page


@require_GET
@tenant_page()
def deployment_requests(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """Recent and slowest requests with their lifecycle; `q` finds a trace or request id;
    `live=1` renders the polled part alone."""
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    query = request.GET.get("q", "")[:MAX_QUERY]
    error, status = None, 200
    try:
        view = inspector.request_list(tenant=tenant, deployment=deployment, query=query)
    except ValidationFailed as exc:
        error, status = exc.message, 400
        view = inspector.request_list(tenant=tenant, deployment=deployment)
    context = {
        "d": deployment,
        "view": view,
        "q": query.strip(),
        "q_error": error,
        "query_help": inspector.QUERY_HELP,
        "recent_shown": inspector.RECENT_SHOWN,
        "slow_shown": inspector.SLOW_SHOWN,
    }
    live = request.GET.get("live") == "1"
    template = "serving/_requests_live.html" if live else "serving/requests.html"
    return render(request, template, context, status=status)
