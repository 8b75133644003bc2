"""Pages of the registry: models and their versions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.exceptions import PortalError
from serving.registry import artifacts, delivery, forms, selectors, services
from serving.registry.models import Model
from tenants import selectors as tenant_selectors
from tenants.models import Scope, Tenant
from tenants.pages import can_write, form_error, page_actor, tenant_page


def _storage(tenant: Tenant) -> dict[str, int]:
    """The tenant's artifact storage, used and allowed (the registry pages show both)."""
    return {
        "storage_used_bytes": selectors.storage_used_bytes(tenant=tenant),
        "storage_quota_bytes": tenant_selectors.quota_get(tenant=tenant).max_storage_bytes,
    }


@tenant_page()
def models_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = forms.ModelCreateForm(request.POST or None)
    if request.method == "POST":
        if not can_write(request):
            raise PermissionDenied("Your role cannot create models.")
        if form.is_valid():
            try:
                model = services.model_create(
                    tenant=tenant, actor=page_actor(request), **form.cleaned_data
                )
            except PortalError as exc:
                form_error(form, exc)
            else:
                messages.success(request, f"Model {model.name} created.")
                return redirect("serving-model", slug=tenant.slug, pk=model.pk)
    context = {
        "models": selectors.model_list(tenant=tenant).order_by("name"),
        "form": form,
        "can_write": can_write(request),
        **_storage(tenant),
    }
    return render(request, "serving/models.html", context)


def _model_page(
    request: HttpRequest,
    tenant: Tenant,
    model: Model,
    *,
    path_form: forms.RegisterPathForm | None = None,
    upload_form: forms.UploadForm | None = None,
    description_form: forms.DescriptionForm | None = None,
) -> HttpResponse:
    context: dict[str, Any] = {
        "model": model,
        "versions": selectors.version_list(tenant=tenant, model=model).order_by("-id"),
        "path_form": path_form or forms.RegisterPathForm(),
        "upload_form": upload_form or forms.UploadForm(),
        "description_form": description_form
        or forms.DescriptionForm(initial={"description": model.description}),
        "can_write": can_write(request),
        "upload_limit": settings.ARTIFACT_UPLOAD_MAX_BYTES,
        **_storage(tenant),
    }
    return render(request, "serving/model.html", context)


@tenant_page()
def model_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    model = selectors.model_get(tenant=tenant, pk=pk)
    if request.method != "POST":
        return _model_page(request, tenant, model)
    if not can_write(request):
        raise PermissionDenied("Your role cannot change models.")
    form = forms.DescriptionForm(request.POST)
    if form.is_valid():
        try:
            services.model_update(
                tenant=tenant, actor=page_actor(request), model=model, **form.cleaned_data
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            messages.success(request, "Description saved.")
            return redirect("serving-model", slug=tenant.slug, pk=model.pk)
    return _model_page(request, tenant, model, description_form=form)


@require_POST
@tenant_page(Scope.WRITE)
def model_delete(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    model = selectors.model_get(tenant=tenant, pk=pk)
    try:
        services.model_delete(tenant=tenant, actor=page_actor(request), model=model)
    except PortalError as exc:
        messages.error(request, exc.message)
        return redirect("serving-model", slug=tenant.slug, pk=model.pk)
    messages.success(request, f"Deleted model {model.name}.")
    return redirect("serving-models", slug=tenant.slug)


@require_POST
@tenant_page(Scope.WRITE)
def version_register(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    model = selectors.model_get(tenant=tenant, pk=pk)
    form = forms.RegisterPathForm(request.POST)
    if form.is_valid():
        try:
            version = services.version_register_path(
                tenant=tenant, actor=page_actor(request), model=model, **form.cleaned_data
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            messages.success(request, f"Registered {version.label}; validation has started.")
            return redirect("serving-model", slug=tenant.slug, pk=model.pk)
    return _model_page(request, tenant, model, path_form=form)


@require_POST
@tenant_page(Scope.WRITE)
def version_upload(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    model = selectors.model_get(tenant=tenant, pk=pk)
    form = forms.UploadForm(request.POST, request.FILES)
    if form.is_valid():
        archive = form.cleaned_data["archive"]
        try:
            version = services.version_register_upload(
                tenant=tenant,
                actor=page_actor(request),
                model=model,
                label=form.cleaned_data["label"],
                sha256=form.cleaned_data["sha256"],
                engines=form.cleaned_data.get("engines"),
                stream=archive,
                content_length=archive.size,
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            if version.failure_reason:
                messages.error(request, f"{version.label} failed: {version.failure_reason}")
            else:
                messages.success(request, f"Uploaded {version.label}; validation has started.")
            return redirect("serving-model", slug=tenant.slug, pk=model.pk)
    return _model_page(request, tenant, model, upload_form=form)


@require_GET
@tenant_page()
def version_row(request: HttpRequest, tenant: Tenant, pk: int, version_pk: int) -> HttpResponse:
    """One version's table row; htmx polls it every second until validation ends."""
    model = selectors.model_get(tenant=tenant, pk=pk)
    version = selectors.version_get(tenant=tenant, pk=version_pk, model=model)
    context = {"v": version, "model": model, "can_write": can_write(request)}
    return render(request, "serving/_version_row.html", context)


@require_POST
@tenant_page(Scope.WRITE)
def version_delete(request: HttpRequest, tenant: Tenant, pk: int, version_pk: int) -> HttpResponse:
    model = selectors.model_get(tenant=tenant, pk=pk)
    version = selectors.version_get(tenant=tenant, pk=version_pk, model=model)
    try:
        services.version_delete(tenant=tenant, actor=page_actor(request), version=version)
    except PortalError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Deleted version {version.label}.")
    return redirect("serving-model", slug=tenant.slug, pk=model.pk)


def _refused(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


async def _async_chunks(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """The same chunks for an ASGI server, one file read at a time off the event loop (Django
    would otherwise read a sync iterator whole into memory before sending it)."""
    read = sync_to_async(next, thread_sensitive=False)
    while (chunk := await read(chunks, None)) is not None:
        yield chunk


@require_GET
def artifact_download(request: HttpRequest, version_id: int, sha256: str) -> HttpResponse:
    """A version's files as a tar, for replicas on any Ray node (ARTIFACT_DELIVERY=portal).
    Only a URL the portal signed (serving.registry.delivery.signed_url) opens it: no session,
    no tenant token, no way to name another version than the one signed."""
    why = delivery.check_signature(
        version_id, sha256, request.GET.get("exp", ""), request.GET.get("sig", "")
    )
    if why:
        return _refused(403, "forbidden", f"This artifact URL is refused: {why}.")
    version = delivery.servable(version_id, sha256)
    if version is None:
        return _refused(404, "not_found", "No ready version has this checksum any more.")
    try:
        entries = delivery.tar_entries(artifacts.local_directory(version.artifact_uri))
    except (artifacts.ArtifactRejected, OSError) as exc:
        return _refused(410, "gone", f"The version's files cannot be read: {exc}")
    chunks = delivery.stream_tar(entries)
    response = StreamingHttpResponse(
        _async_chunks(chunks) if isinstance(request, ASGIRequest) else chunks,
        content_type="application/x-tar",
    )
    response["Content-Length"] = str(delivery.tar_size(entries))
    response["X-Artifact-Sha256"] = sha256
    response["Cache-Control"] = "private, no-store"
    return response
