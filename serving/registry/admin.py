"""Admin screens for platform staff: shared KV pools are managed here; tenants' models,
versions, deployments and revisions are shown read-only (their writes go through services)."""

from django.contrib import admin

from portal.admin import ReadOnlyAdmin
from serving.registry.models import Model, ModelVersion


@admin.register(Model)
class ModelAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "name", "task", "created_at"]
    search_fields = ["name", "tenant__slug"]


@admin.register(ModelVersion)
class ModelVersionAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "model", "label", "status", "size_bytes", "created_at"]
    list_filter = ["status"]
