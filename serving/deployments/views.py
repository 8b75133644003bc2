"""Pages of the deployments room: deployments, canaries, traffic, keys."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.exceptions import PortalError
from serving.control.cluster import ClusterConfigError, ray_target_from_env
from serving.deployments import forms
from serving.deployments import selectors as deployment_selectors
from serving.deployments import services as deployments
from serving.deployments.capacity import capacity_view
from serving.deployments.drift import drift_state
from serving.deployments.models import (
    SPEC_FIELDS,
    Deployment,
    DeploymentRevision,
    InferenceKey,
)
from serving.deployments.recovery import deployment_recovery
from serving.registry import selectors
from serving.registry.models import ModelVersion, VersionStatus
from tenants.models import Scope, Tenant
from tenants.pages import can_admin, can_deploy, form_error, page_actor, tenant_page
from tenants.scoping import get_for_tenant


def ready_versions(tenant: Tenant) -> QuerySet[ModelVersion]:
    return (
        selectors.version_list(tenant=tenant)
        .filter(status=VersionStatus.READY)
        .order_by("model__name", "-id")
    )


def canary_versions(tenant: Tenant, deployment: Deployment) -> QuerySet[ModelVersion]:
    """Ready versions a canary may run: any but the stable one."""
    revision = deployment.current_revision
    versions = ready_versions(tenant)
    return versions.exclude(pk=revision.stable_version_id) if revision else versions


def _serve_url() -> str:
    """Where clients reach the Serve proxy, for the curl example shown with a new key."""
    try:
        return ray_target_from_env().serve_url
    except (ClusterConfigError, OSError):  # misconfigured, or the head's token unreadable
        return "http://SERVE-PROXY"


def _created_key(deployment: Deployment, name: str, raw: str) -> dict[str, str]:
    return {
        "name": name,
        "raw": raw,
        "deployment": deployment.name,
        "url": f"{_serve_url()}/{deployment.tenant.slug}/{deployment.name}/v1/completions",
    }


@tenant_page()
def deployments_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    versions = ready_versions(tenant)
    form = forms.DeploymentCreateForm(request.POST or None, versions=versions)
    created = None
    if request.method == "POST":
        if not can_deploy(request):
            raise PermissionDenied("Your role cannot deploy.")
        if form.is_valid():
            data = form.cleaned_data
            try:
                deployment, raw = deployments.deployment_create(
                    tenant=tenant,
                    actor=page_actor(request),
                    name=data["name"],
                    version_id=data["version"].pk,
                    description=data["description"],
                    settings=form.settings(),
                )
            except PortalError as exc:
                form_error(form, exc)
            else:
                created = {"pk": deployment.pk, **_created_key(deployment, "default", raw)}
                form = forms.DeploymentCreateForm(versions=versions)
    context = {
        "deployments": deployment_selectors.deployment_list(tenant=tenant).order_by("name"),
        "form": form,
        "created": created,
        "has_versions": versions.exists(),
        "can_deploy": can_deploy(request),
        "cluster": capacity_view(),
    }
    return render(request, "serving/deployments.html", context)


def _fmt(value: Any) -> str:
    if value is None or value in ({}, []):
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(
            f"{k}=({_fmt(v)})" if isinstance(v, dict) else f"{k}={_fmt(v)}"
            for k, v in sorted(value.items())
        )
    return str(value)


# Spec fields shown by the object they point to rather than by id.
_RELATED = {
    "stable_version_id": "stable_version",
    "canary_version_id": "canary_version",
    "pool_id": "pool",
}


def _spec_changes(
    revision: DeploymentRevision, previous: DeploymentRevision
) -> list[dict[str, Any]]:
    """What `revision` changed against `previous`: field, old, new (keys only as "rotated")."""
    old, new = previous.spec(), revision.spec()
    changes: list[dict[str, Any]] = []
    for name in SPEC_FIELDS:
        if old[name] == new[name]:
            continue
        if name == "batch_key_hashes":  # changes only with key_hashes: "keys rotated"
            continue
        if name == "key_hashes":  # never show hashes, not even shortened
            changes.append({"field": "keys", "rotated": True})
        elif name in _RELATED:
            related = _RELATED[name]
            changes.append(
                {
                    "field": related,
                    "old": _fmt(getattr(previous, related)),
                    "new": _fmt(getattr(revision, related)),
                }
            )
        else:
            changes.append({"field": name, "old": _fmt(old[name]), "new": _fmt(new[name])})
    return changes


REVISIONS_SHOWN = 50


def _revision_history(tenant: Tenant, deployment: Deployment) -> list[dict[str, Any]]:
    revisions = list(
        deployment_selectors.revision_list(tenant=tenant, deployment=deployment).select_related(
            "created_by"
        )[: REVISIONS_SHOWN + 1]
    )  # newest first; one more than shown, to diff the oldest shown against
    history = []
    for index, revision in enumerate(revisions[:REVISIONS_SHOWN]):
        previous = revisions[index + 1] if index + 1 < len(revisions) else None
        changes = _spec_changes(revision, previous) if previous is not None else None
        history.append({"revision": revision, "changes": changes})
    return history


def _deployment_page(
    request: HttpRequest,
    tenant: Tenant,
    deployment: Deployment,
    *,
    scale_form: forms.DeploymentSettingsForm | None = None,
    canary_form: forms.CanaryForm | None = None,
    traffic_form: forms.TrafficForm | None = None,
    key_form: forms.InferenceKeyForm | None = None,
    created_key: dict[str, str] | None = None,
) -> HttpResponse:
    revision = deployment.current_revision
    canary = revision is not None and revision.canary_version_id is not None
    percent = forms.plain(revision.canary_percent) if revision is not None and canary else None
    context: dict[str, Any] = {
        "pool_share": deployment_selectors.deployment_pool_share(
            tenant=tenant, deployment=deployment
        ),
        "recovery": deployment_recovery(deployment=deployment),
        "drift": drift_state(deployment),
        "d": deployment,
        "rev": revision,
        "history": _revision_history(tenant, deployment),
        "scale_form": scale_form
        or forms.DeploymentSettingsForm(
            initial=forms.DeploymentSettingsForm.initial_from(revision) if revision else None
        ),
        "canary_form": canary_form
        or forms.CanaryForm(
            versions=canary_versions(tenant, deployment),
            initial={
                "version": revision.canary_version_id if revision else None,
                "percent": 10 if percent is None else percent,
            },
        ),
        "traffic_form": traffic_form or forms.TrafficForm(initial={"percent": percent or 0}),
        "key_form": key_form or forms.InferenceKeyForm(),
        "created_key": created_key,
        "can_deploy": can_deploy(request),
        "can_admin": can_admin(request),
    }
    if context["can_admin"]:
        context["keys"] = deployment_selectors.inference_key_list(
            tenant=tenant, deployment=deployment
        )
    return render(request, "serving/deployment.html", context)


@require_GET
@tenant_page()
def deployment_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    return _deployment_page(
        request, tenant, deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    )


@require_GET
@tenant_page()
def deployment_status(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """The live status panel; htmx polls it every 2 s."""
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    context = {
        "d": deployment,
        "rev": deployment.current_revision,
        "drift": drift_state(deployment),
    }
    return render(request, "serving/_deployment_status.html", context)


def _changed(
    request: HttpRequest, tenant: Tenant, deployment: Deployment, before: int | None
) -> HttpResponse:
    revision = deployment.current_revision
    if revision is None or revision.pk == before:
        messages.info(request, "Nothing changed.")
    else:
        messages.success(request, f"Revision {revision.number}: {revision.reason}.")
    return redirect("serving-deployment", slug=tenant.slug, pk=deployment.pk)


@require_POST
@tenant_page(Scope.DEPLOY)
def deployment_scale(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    before = deployment.current_revision_id
    form = forms.DeploymentSettingsForm(request.POST)
    if form.is_valid():
        changes = form.settings()
        reason = deployments.change_reason(
            deployment=deployment, changes=changes, unchanged="settings saved"
        )
        try:
            deployments.deployment_change(
                tenant=tenant,
                actor=page_actor(request),
                deployment=deployment,
                changes=changes,
                reason=reason,
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            return _changed(request, tenant, deployment, before)
    return _deployment_page(request, tenant, deployment, scale_form=form)


@require_POST
@tenant_page(Scope.DEPLOY)
def deployment_canary(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    before = deployment.current_revision_id
    form = forms.CanaryForm(request.POST, versions=canary_versions(tenant, deployment))
    if form.is_valid():
        try:
            deployments.deployment_set_canary(
                tenant=tenant,
                actor=page_actor(request),
                deployment=deployment,
                version_id=form.cleaned_data["version"].pk,
                percent=form.cleaned_data["percent"],
                engine=form.canary_engine(),
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            return _changed(request, tenant, deployment, before)
    return _deployment_page(request, tenant, deployment, canary_form=form)


@require_POST
@tenant_page(Scope.DEPLOY)
def deployment_traffic(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    before = deployment.current_revision_id
    form = forms.TrafficForm(request.POST)
    if form.is_valid():
        try:
            deployments.deployment_set_traffic(
                tenant=tenant,
                actor=page_actor(request),
                deployment=deployment,
                percent=form.cleaned_data["percent"],
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            return _changed(request, tenant, deployment, before)
    return _deployment_page(request, tenant, deployment, traffic_form=form)


@require_POST
@tenant_page(Scope.DEPLOY)
def deployment_promote(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    before = deployment.current_revision_id
    try:
        deployments.deployment_promote(
            tenant=tenant, actor=page_actor(request), deployment=deployment
        )
    except PortalError as exc:
        messages.error(request, exc.message)
        return redirect("serving-deployment", slug=tenant.slug, pk=deployment.pk)
    return _changed(request, tenant, deployment, before)


@require_POST
@tenant_page(Scope.DEPLOY)
def deployment_delete(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    try:
        deployments.deployment_delete(
            tenant=tenant, actor=page_actor(request), deployment=deployment
        )
    except PortalError as exc:
        messages.error(request, exc.message)
        return redirect("serving-deployment", slug=tenant.slug, pk=deployment.pk)
    messages.success(request, f"Deleted deployment {deployment.name}; it is leaving Serve.")
    return redirect("serving-deployments", slug=tenant.slug)


@require_POST
@tenant_page(Scope.ADMIN)
def inference_key_create(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    form = forms.InferenceKeyForm(request.POST)
    created = None
    if form.is_valid():
        try:
            key, raw = deployments.inference_key_create(
                tenant=tenant, actor=page_actor(request), deployment=deployment, **form.cleaned_data
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            created = _created_key(deployment, key.name, raw)
            form = forms.InferenceKeyForm()
            deployment = deployment_selectors.deployment_get(
                tenant=tenant, pk=pk
            )  # the key's revision changed its status
    return _deployment_page(request, tenant, deployment, key_form=form, created_key=created)


@require_POST
@tenant_page(Scope.ADMIN)
def inference_key_revoke(
    request: HttpRequest, tenant: Tenant, pk: int, key_pk: int
) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    key = get_for_tenant(
        InferenceKey.objects.filter(deployment=deployment), tenant=tenant, pk=key_pk
    )
    key = deployments.inference_key_revoke(tenant=tenant, actor=page_actor(request), key=key)
    if request.headers.get("HX-Request"):
        context = {"k": key, "d": deployment, "can_admin": True}
        return render(request, "serving/_deployment_key_row.html", context)
    messages.success(request, f"Revoked key {key.name} ({key.prefix}…).")
    return redirect("serving-deployment", slug=tenant.slug, pk=deployment.pk)
