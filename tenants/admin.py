from django.contrib import admin

from tenants import services
from tenants.actors import Actor
from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Quota, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "plan", "is_active", "created_at"]
    search_fields = ["slug", "name"]
    actions = ["suspend", "reinstate"]

    def save_model(self, request, obj, form, change):  # type: ignore[no-untyped-def]
        """Suspension goes through the service (audit, reconcile, drills, notifications)."""
        if change and "is_active" in form.changed_data:
            wanted = obj.is_active
            obj.is_active = not wanted
            super().save_model(request, obj, form, change)
            services.tenant_set_suspended(
                tenant=obj,
                actor=Actor(user=request.user),
                suspended=not wanted,
                reason="changed in the admin",
            )
            obj.is_active = wanted
            return
        super().save_model(request, obj, form, change)

    @admin.action(description="Suspend the selected tenants (traffic, drills, notifications)")
    def suspend(self, request, queryset):  # type: ignore[no-untyped-def]
        for tenant in queryset:
            services.tenant_set_suspended(
                tenant=tenant,
                actor=Actor(user=request.user),
                suspended=True,
                reason="suspended in the admin",
            )

    @admin.action(description="Reinstate the selected tenants")
    def reinstate(self, request, queryset):  # type: ignore[no-untyped-def]
        for tenant in queryset:
            services.tenant_set_suspended(
                tenant=tenant, actor=Actor(user=request.user), suspended=False
            )


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["tenant", "user", "role"]
    list_filter = ["role"]


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = [
        "tenant",
        "max_deployments",
        "max_replicas",
        "max_gpus",
        "max_gpu_memory_mb_per_replica",
        "requests_per_second",
    ]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["tenant", "name", "prefix", "expires_at", "revoked_at", "last_used_at"]
    readonly_fields = ["prefix", "token_hash"]


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ["tenant", "email", "role", "created_at", "accepted_at", "revoked_at"]
    readonly_fields = ["token_hash"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["tenant", "actor_label", "action", "object_type", "object_id", "created_at"]
    list_filter = ["action"]

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False  # the audit trail is append-only
