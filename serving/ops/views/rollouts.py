"""Pages of the ops loop on one deployment, second part: rollouts (policy, start, progress,
pause/resume/confirm/abort) and the rollback history with "roll back to previous"."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from portal.exceptions import PortalError
from serving.deployments import selectors as deployment_selectors
from serving.deployments.models import Deployment
from serving.ops import forms as ops_forms
from serving.ops import rollbacks, rollouts
from serving.ops import selectors as ops_selectors
from serving.ops.models import RollbackStatus, Rollout
from serving.ops.views.health import require_deploy
from serving.registry import selectors as registry
from serving.registry.models import VersionStatus
from tenants.models import Scope, Tenant
from tenants.pages import can_deploy, page_actor, tenant_page
from tenants.scoping import get_for_tenant

# action -> (service, what the page says when it worked)
ROLLOUT_ACTIONS = {
    "pause": (rollouts.rollout_pause, "Rollout paused."),
    "resume": (rollouts.rollout_resume, "Rollout resumed."),
    "confirm": (rollouts.rollout_confirm, "Confirmed: the canary is promoted."),
    "abort": (rollouts.rollout_abort, "Rollout aborted: traffic goes back to stable."),
}


def _rollout_steps(rollout: Rollout) -> list[dict[str, Any]]:
    finished = rollout.status == "successful"
    return [
        {
            **step,
            "number": index + 1,
            "state": "done"
            if finished or index < rollout.step_index
            else ("current" if index == rollout.step_index else "pending"),
        }
        for index, step in enumerate(rollout.steps)
    ]


def _rollout_context(
    request: HttpRequest, tenant: Tenant, deployment: Deployment
) -> dict[str, Any]:
    recent = list(ops_selectors.rollout_list(tenant=tenant, deployment=deployment)[:10])
    rollout = next((r for r in recent if r.is_active), recent[0] if recent else None)
    return {
        "d": deployment,
        "rollout": rollout,
        "steps": _rollout_steps(rollout) if rollout else [],
        "analyses": list(rollout.analyses.order_by("-at")[:20]) if rollout else [],
        "recent": recent,
        "can_deploy": can_deploy(request),
    }


def _rollback_context(
    request: HttpRequest, tenant: Tenant, deployment: Deployment
) -> dict[str, Any]:
    rows = list(ops_selectors.rollback_list(tenant=tenant, deployment=deployment)[:20])

    def span(a: datetime | None, b: datetime | None) -> float | None:
        return None if a is None or b is None else (b - a).total_seconds()

    history = [
        {
            "r": r,
            "to_start": span(r.detected_at, r.started_at),
            "to_switch": span(r.started_at, r.traffic_switched_at),
            "to_finish": span(r.traffic_switched_at, r.finished_at),
            "total": span(r.detected_at, r.finished_at),
        }
        for r in rows
    ]
    current = deployment.current_revision
    target = rollbacks.rollback_target(deployment, current) if current is not None else None
    return {
        "d": deployment,
        "history": history,
        "target": target,
        "busy": any(r.status in (RollbackStatus.PENDING, RollbackStatus.SWITCHING) for r in rows),
        "can_deploy": can_deploy(request),
    }


def _rollouts_page(
    request: HttpRequest,
    tenant: Tenant,
    deployment: Deployment,
    *,
    policy_form: ops_forms.PolicyForm | None = None,
    start_form: ops_forms.RolloutStartForm | None = None,
) -> HttpResponse:
    policy = getattr(deployment, "rollout_policy", None)
    revision = deployment.current_revision
    versions = registry.version_list(tenant=tenant).filter(status=VersionStatus.READY)
    if revision is not None:
        versions = versions.exclude(pk=revision.stable_version_id)
    context = {
        **_rollback_context(request, tenant, deployment),
        **_rollout_context(request, tenant, deployment),
        "policy": policy,
        "policy_form": policy_form
        or ops_forms.PolicyForm(initial=ops_forms.PolicyForm.initial_from(policy)),
        "start_form": start_form
        or ops_forms.RolloutStartForm(versions=versions.order_by("model__name", "-id")),
    }
    return render(request, "serving/ops/rollouts.html", context)


@require_GET
@tenant_page()
def rollouts_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    return _rollouts_page(
        request, tenant, deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    )


@require_GET
@tenant_page()
def rollout_progress(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """The rollout progress panel; htmx polls it every 2 s while a rollout is active."""
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    context = _rollout_context(request, tenant, deployment)
    return render(request, "serving/ops/_rollout_progress.html", context)


@require_POST
@tenant_page(Scope.DEPLOY)
def rollout_policy(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    form = ops_forms.PolicyForm(request.POST)
    if form.is_valid():
        try:
            rollouts.policy_set(
                tenant=tenant,
                actor=page_actor(request),
                deployment=deployment,
                values=form.cleaned_data,
            )
        except PortalError as exc:
            form.add_error(form.error_field(exc.field), form.error_message(exc.field, exc.message))
        else:
            messages.success(request, "Rollout policy saved.")
            return redirect("serving-deployment-rollouts", slug=tenant.slug, pk=deployment.pk)
    return _rollouts_page(request, tenant, deployment, policy_form=form)


@require_POST
@tenant_page(Scope.DEPLOY)
def rollout_start(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    versions = registry.version_list(tenant=tenant).filter(status=VersionStatus.READY)
    form = ops_forms.RolloutStartForm(request.POST, versions=versions)
    if form.is_valid():
        try:
            rollout = rollouts.rollout_start(
                tenant=tenant,
                actor=page_actor(request),
                deployment=deployment,
                version_id=form.cleaned_data["version"].pk,
            )
        except PortalError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"Rollout of {rollout.canary_version} started.")
            return redirect("serving-deployment-rollouts", slug=tenant.slug, pk=deployment.pk)
    return _rollouts_page(request, tenant, deployment, start_form=form)


@require_POST
@tenant_page(Scope.DEPLOY)
def rollout_action(
    request: HttpRequest, tenant: Tenant, pk: int, rollout_pk: int, action: str
) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    if action not in ROLLOUT_ACTIONS:
        raise Http404("No such rollout action.")
    service, done = ROLLOUT_ACTIONS[action]
    rollout = get_for_tenant(
        Rollout.objects.filter(deployment=deployment).select_related("deployment"),
        tenant=tenant,
        pk=rollout_pk,
    )
    try:
        service(tenant=tenant, actor=page_actor(request), rollout=rollout)
    except PortalError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, done)
    return redirect("serving-deployment-rollouts", slug=tenant.slug, pk=deployment.pk)


@require_http_methods(["GET", "POST"])
@tenant_page()
def rollbacks_panel(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """GET: the rollback history panel (loaded into the deployment page, polled while one
    runs). POST: roll back to the previous revision now."""
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    if request.method == "GET":
        context = _rollback_context(request, tenant, deployment)
        return render(request, "serving/ops/_rollbacks.html", context)
    require_deploy(request)
    try:
        rollback, created = rollbacks.rollback_request(
            tenant=tenant,
            deployment=deployment,
            trigger="manual",
            reason=f"rolled back by {request.user.email} from the portal",  # type: ignore[union-attr]
            actor=page_actor(request),
        )
    except PortalError as exc:
        messages.error(request, exc.message)
    else:
        verb = "started" if created else "already under way"
        messages.success(request, f"Rollback to revision #{rollback.to_revision.number} {verb}.")
    return redirect("serving-deployment", slug=tenant.slug, pk=deployment.pk)
