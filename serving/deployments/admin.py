"""Admin screens for platform staff: shared KV pools are managed here; tenants' models,
versions, deployments and revisions are shown read-only (their writes go through services)."""

from typing import Any

from django.contrib import admin
from django.db import transaction
from django.http import HttpRequest

from portal.admin import ReadOnlyAdmin
from serving.deployments.models import (
    Deployment,
    DeploymentRevision,
    InferenceKey,
    ReconcileRun,
    SharedPool,
)


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
        super().save_model(request, obj, form, change)
        from django.conf import settings

        from serving.deployments.tasks import reconcile

        if settings.RECONCILE_ON_COMMIT:  # the pool's replicas follow the new settings
            transaction.on_commit(lambda: reconcile.delay())


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "name", "status", "current_revision", "status_at", "deleted_at"]
    list_filter = ["status"]
    search_fields = ["name", "tenant__slug"]


@admin.register(DeploymentRevision)
class DeploymentRevisionAdmin(ReadOnlyAdmin):
    list_display = ["deployment", "number", "reason", "applied_at", "converged_at", "serve_status"]
    exclude = ["key_hashes"]


@admin.register(InferenceKey)
class InferenceKeyAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "deployment", "name", "prefix", "is_probe", "revoked_at"]
    exclude = ["key_hash"]


@admin.register(ReconcileRun)
class ReconcileRunAdmin(ReadOnlyAdmin):
    list_display = ["started_at", "ok", "skipped", "applications", "duration_ms", "error"]
    list_filter = ["ok", "skipped"]
