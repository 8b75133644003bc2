"""Admin screens for platform staff: shared KV pools are managed here; tenants' models,
versions, deployments and revisions are shown read-only (their writes go through services)."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from portal.admin import ReadOnlyAdmin
from serving.deployments.models import (
    Deployment,
    DeploymentRevision,
    InferenceKey,
    ReconcileRun,
    SharedPool,
)
from serving.deployments.services import pool_save
from tenants.actors import Actor


@admin.register(SharedPool)
class SharedPoolAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "name",
        "model_version",
        "num_replicas",
        "num_cpus",
        "num_gpus",
        "kv_blocks",
        "min_tenants",
        "max_num_seqs",
        "is_active",
    ]
    list_filter = ["is_active"]
    filter_horizontal = ["allowed_tenants"]  # only these tenants may deploy onto the pool

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Saved through the audited service, with the grants the form holds (the admin's own
        m2m save in save_related is then skipped: the service already set them)."""
        pool_save(
            pool=obj,
            actor=Actor(user=request.user),
            allowed_tenants=form.cleaned_data.get("allowed_tenants"),
        )

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        for formset in formsets:
            self.save_formset(request, form, formset, change=change)


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "name", "status", "current_revision", "status_at", "deleted_at"]
    list_filter = ["status"]
    search_fields = ["name", "tenant__slug"]


@admin.register(DeploymentRevision)
class DeploymentRevisionAdmin(ReadOnlyAdmin):
    list_display = ["deployment", "number", "reason", "applied_at", "converged_at", "serve_status"]
    exclude = ["key_hashes", "batch_key_hashes"]


@admin.register(InferenceKey)
class InferenceKeyAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "deployment", "name", "prefix", "priority", "is_probe", "revoked_at"]
    exclude = ["key_hash"]


@admin.register(ReconcileRun)
class ReconcileRunAdmin(ReadOnlyAdmin):
    list_display = ["started_at", "ok", "skipped", "applications", "duration_ms", "error"]
    list_filter = ["ok", "skipped"]
