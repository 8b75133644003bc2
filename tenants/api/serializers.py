"""Shapes of the tenants API. Serializers validate input shape; services own the rules."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants import usage
from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Quota, Role, Scope, Tenant
from tenants.services.tokens import TOKEN_RATE_LIMIT_MAX


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "plan", "is_active", "created_at"]
        read_only_fields = ["id", "slug", "plan", "is_active", "created_at"]


class TenantCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120)


class MembershipSerializer(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "email", "role", "created_at"]
        read_only_fields = ["id", "email", "created_at"]


class MembershipUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class InvitationSerializer(serializers.ModelSerializer):
    status = serializers.CharField(read_only=True)
    invited_by = serializers.EmailField(source="invited_by.email", read_only=True, default=None)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "status", "invited_by", "created_at", "expires_at"]
        read_only_fields = fields


class InvitationCreateSerializer(serializers.Serializer):
    email = serializers.EmailField()
    role = serializers.ChoiceField(choices=Role.choices)


class InvitationCreatedSerializer(InvitationSerializer):
    accept_url = serializers.CharField(read_only=True)

    class Meta(InvitationSerializer.Meta):
        fields = [*InvitationSerializer.Meta.fields, "accept_url"]
        read_only_fields = fields


class InvitationAcceptSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=200)


class ApiTokenSerializer(serializers.ModelSerializer):
    status = serializers.CharField(read_only=True)
    created_by = serializers.EmailField(source="created_by.email", read_only=True, default=None)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "scopes",
            "status",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "rate_limit_per_second",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=Scope.choices), min_length=1, max_length=4
    )
    expires_in_days = serializers.IntegerField(
        min_value=1, max_value=settings.API_TOKEN_MAX_DAYS, required=False
    )
    rate_limit_per_second = serializers.IntegerField(
        min_value=1, max_value=TOKEN_RATE_LIMIT_MAX, required=False
    )


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The secret; shown only once.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class QuotaSerializer(serializers.ModelSerializer):
    storage_used_bytes = serializers.SerializerMethodField(
        help_text="Bytes of model artifacts the tenant holds now, against max_storage_bytes."
    )

    class Meta:
        model = Quota
        fields = [
            "id",
            "max_deployments",
            "max_replicas",
            "max_gpus",
            "max_kv_blocks",
            "requests_per_second",
            "max_storage_bytes",
            "storage_used_bytes",
            "max_drills",
            "max_concurrent_drill_runs",
            "max_gpu_memory_mb_per_replica",
            "updated_at",
        ]
        read_only_fields = ["id", "storage_used_bytes", "updated_at"]
        extra_kwargs = {name: {"required": False} for name in fields}

    @extend_schema_field(serializers.IntegerField())
    def get_storage_used_bytes(self, quota: Quota) -> int:
        annotated = getattr(quota, "storage_used_bytes", None)  # quotas_with_storage_used()
        if annotated is not None:
            return int(annotated)
        return usage.storage_used_bytes(quota.tenant)


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "actor_label",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "before",
            "after",
            "created_at",
        ]
        read_only_fields = fields


class SignupSerializer(serializers.Serializer):
    email = serializers.EmailField()
    password = serializers.CharField(write_only=True, style={"input_type": "password"})
    organisation = serializers.CharField(max_length=120)


class SignupResultSerializer(serializers.Serializer):
    email = serializers.EmailField()
    tenant = TenantSerializer()
    verification_required = serializers.BooleanField()
