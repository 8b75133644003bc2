"""Deployments API: create, scale, canary, traffic, promote, delete; revisions and keys."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.validation import validated
from serving.deployments import selectors, services
from serving.deployments.capacity import capacity_view
from serving.deployments.models import (
    Deployment,
    DeploymentRevision,
    InferenceKey,
    KeyPriority,
    KvMode,
)
from serving.deployments.spec_checks import SETTING_LIMITS
from tenants.api.base import TenantScopedViewSet
from tenants.models import Scope, Tenant


def limited(setting: str, *, required: bool = False) -> serializers.Field:
    """A number field with the bounds the services enforce (spec_checks.SETTING_LIMITS)."""
    low, high, integer = SETTING_LIMITS[setting]
    if integer:
        return serializers.IntegerField(min_value=int(low), max_value=int(high), required=required)
    return serializers.FloatField(min_value=low, max_value=high, required=required)


class AutoscalingSerializer(serializers.Serializer):
    min_replicas = limited("autoscaling.min_replicas")
    max_replicas = limited("autoscaling.max_replicas", required=True)
    target_ongoing_requests = limited("autoscaling.target_ongoing_requests")


class SettingsSerializer(serializers.Serializer):
    num_replicas = limited("num_replicas")
    autoscaling = AutoscalingSerializer(required=False, allow_null=True)
    num_cpus = limited("num_cpus")
    num_gpus = limited("num_gpus")
    max_ongoing_requests = limited("max_ongoing_requests")
    kv_mode = serializers.ChoiceField(choices=KvMode.choices, required=False)
    pool = serializers.SlugField(required=False)
    kv_blocks = limited("kv_blocks")
    block_size = limited("block_size")
    guard = serializers.DictField(required=False)
    breaker = serializers.DictField(required=False)
    tiers = serializers.JSONField(required=False, help_text="degraded tiers (docs/architecture)")
    traffic = serializers.JSONField(
        required=False,
        help_text='sticky A/B by client key: {"sticky": true, "client_key_header": '
        '"x-client-key", "user_field": true}',
    )
    kv_cache = serializers.JSONField(
        required=False,
        help_text='KV cache lifetime: {"prefix_caching": true|false, "max_age_s": seconds}',
    )
    engine = serializers.JSONField(
        required=False,
        help_text='the stable slot\'s engine: "builtin" or {"name": "vllm", "dtype": ..., '
        '"max_model_len": ..., "gpu_memory_utilization": ..., "cpu_kv_space_gib": ..., '
        '"max_num_seqs": ..., "enable_prefix_caching": ..., "tensor_parallel_size": ...}',
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("num_replicas") is not None and attrs.get("autoscaling"):
            raise serializers.ValidationError(
                {"autoscaling": "give num_replicas or autoscaling, not both"}
            )
        return attrs


class DeploymentCreateSerializer(SettingsSerializer):
    name = serializers.CharField(max_length=40)
    version = serializers.IntegerField(min_value=1, help_text="id of a ready model version")
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class RevisionSerializer(serializers.ModelSerializer):
    stable_version = serializers.StringRelatedField()
    canary_version = serializers.StringRelatedField()
    pool = serializers.StringRelatedField()

    class Meta:
        model = DeploymentRevision
        fields = [
            "id",
            "number",
            "reason",
            "stable_version",
            "canary_version",
            "canary_percent",
            "num_replicas",
            "autoscaling",
            "num_cpus",
            "num_gpus",
            "max_ongoing_requests",
            "kv_mode",
            "pool",
            "kv_blocks",
            "block_size",
            "guard",
            "breaker",
            "faults",
            "engine",
            "canary_engine",
            "tiers",
            "traffic",
            "kv_cache",
            "created_at",
            "applied_at",
            "converged_at",
            "serve_status",
            "serve_message",
        ]
        read_only_fields = fields


class DeploymentSerializer(serializers.ModelSerializer):
    revision = RevisionSerializer(source="current_revision", read_only=True)
    route = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "id",
            "name",
            "description",
            "status",
            "status_message",
            "status_at",
            "route",
            "revision",
            "created_at",
        ]
        read_only_fields = fields

    def get_route(self, obj: Deployment) -> str:
        return f"/{obj.tenant.slug}/{obj.name}/v1"


class PoolShareSerializer(serializers.Serializer):
    """A shared deployment's fair share of its pool (all pool replicas together) and what it
    uses now, as the pool's replicas publish it (null while none has)."""

    pool = serializers.CharField(read_only=True)
    allowed = serializers.BooleanField(
        read_only=True, help_text="false: the platform revoked this tenant's place in the pool"
    )
    tenants_min = serializers.IntegerField(
        read_only=True, help_text="the pool is shared as if by at least this many tenants"
    )
    replicas = serializers.IntegerField(read_only=True)
    quota_blocks = serializers.IntegerField(read_only=True)
    max_running = serializers.IntegerField(read_only=True)
    blocks_used = serializers.IntegerField(read_only=True, allow_null=True)
    running = serializers.IntegerField(read_only=True, allow_null=True)
    waiting = serializers.IntegerField(read_only=True, allow_null=True)
    replicas_reporting = serializers.IntegerField(read_only=True, allow_null=True)


class DeploymentDetailSerializer(DeploymentSerializer):
    pool_share = serializers.SerializerMethodField()

    class Meta(DeploymentSerializer.Meta):
        fields = [*DeploymentSerializer.Meta.fields, "pool_share"]
        read_only_fields = fields

    @extend_schema_field(PoolShareSerializer(allow_null=True))
    def get_pool_share(self, obj: Deployment) -> dict[str, Any] | None:
        share = selectors.deployment_pool_share(tenant=obj.tenant, deployment=obj)
        return None if share is None else dict(PoolShareSerializer(share).data)


class DeploymentCreatedSerializer(DeploymentSerializer):
    inference_key = serializers.CharField(read_only=True, help_text="shown only once")

    class Meta(DeploymentSerializer.Meta):
        fields = [*DeploymentSerializer.Meta.fields, "inference_key"]
        read_only_fields = fields


class CanarySerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1)
    percent = limited("canary_percent", required=True)
    engine = serializers.JSONField(
        required=False, allow_null=True, help_text="the canary's engine (default: the stable's)"
    )


class TrafficSerializer(serializers.Serializer):
    percent = limited("canary_percent", required=True)


class KeySerializer(serializers.ModelSerializer):
    class Meta:
        model = InferenceKey
        fields = ["id", "name", "prefix", "priority", "is_probe", "created_at", "revoked_at"]
        read_only_fields = fields


class KeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    priority = serializers.ChoiceField(choices=KeyPriority.values, default=KeyPriority.REALTIME)


class KeyCreatedSerializer(KeySerializer):
    key = serializers.CharField(read_only=True, help_text="shown only once")

    class Meta(KeySerializer.Meta):
        fields = [*KeySerializer.Meta.fields, "key"]
        read_only_fields = fields


class _AmountSerializer(serializers.Serializer):
    total = serializers.FloatField()
    used = serializers.FloatField()
    free = serializers.FloatField()


class CapacitySerializer(serializers.Serializer):
    known = serializers.BooleanField()
    nodes = serializers.IntegerField(required=False)
    cpu = _AmountSerializer(required=False)
    gpu = _AmountSerializer(required=False)
    memory_bytes = _AmountSerializer(required=False)
    autoscales = serializers.BooleanField(required=False)


class DeploymentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Deployments of your tenant. Every change makes a new numbered revision, applied to
    Ray Serve by the reconcile loop; `status` is what Serve reports."""

    queryset = Deployment.objects.none()
    serializer_class = DeploymentSerializer
    action_scopes = {
        "create": Scope.DEPLOY,
        "partial_update": Scope.DEPLOY,
        "destroy": Scope.DEPLOY,
        "canary": Scope.DEPLOY,
        "traffic": Scope.DEPLOY,
        "promote": Scope.DEPLOY,
        "keys": Scope.ADMIN,
        "revisions": Scope.READ,
        "capacity": Scope.READ,
    }

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.deployment_list(tenant=tenant)

    @extend_schema(responses=DeploymentDetailSerializer)
    def retrieve(self, request: Request, pk: str) -> Response:
        """One deployment; a shared one also shows its share of the pool (`pool_share`)."""
        return Response(DeploymentDetailSerializer(self.get_object()).data)

    def _out(self, deployment: Deployment, code: int = 200, **extra: Any) -> Response:
        fresh = selectors.deployment_list(tenant=self.ctx.tenant).get(pk=deployment.pk)
        data = {**DeploymentSerializer(fresh).data, **extra}
        return Response(data, status=code)

    @extend_schema(request=DeploymentCreateSerializer, responses={201: DeploymentCreatedSerializer})
    def create(self, request: Request) -> Response:
        data = validated(DeploymentCreateSerializer, request.data)
        deployment, key = services.deployment_create(
            tenant=self.ctx.tenant,
            actor=self.ctx.actor,
            name=data.pop("name"),
            version_id=data.pop("version"),
            description=data.pop("description", ""),
            settings=data,
        )
        return self._out(deployment, status.HTTP_201_CREATED, inference_key=key)

    @extend_schema(request=SettingsSerializer, responses=DeploymentSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        data = validated(SettingsSerializer, request.data, partial=True)
        if "pool" in data:
            raise serializers.ValidationError({"pool": "the pool is chosen at creation"})
        services.deployment_change(
            tenant=self.ctx.tenant,
            actor=self.ctx.actor,
            deployment=deployment,
            changes=data,
            reason=services.change_reason(
                deployment=deployment, changes=data, unchanged="no change"
            ),
        )
        return self._out(deployment)

    def destroy(self, request: Request, pk: str) -> Response:
        services.deployment_delete(
            tenant=self.ctx.tenant, actor=self.ctx.actor, deployment=self.get_object()
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=CanarySerializer, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def canary(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        data = validated(CanarySerializer, request.data)
        services.deployment_set_canary(
            tenant=self.ctx.tenant,
            actor=self.ctx.actor,
            deployment=deployment,
            version_id=data["version"],
            percent=data["percent"],
            engine=data.get("engine"),
        )
        return self._out(deployment)

    @extend_schema(request=TrafficSerializer, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def traffic(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        data = validated(TrafficSerializer, request.data)
        services.deployment_set_traffic(
            tenant=self.ctx.tenant,
            actor=self.ctx.actor,
            deployment=deployment,
            percent=data["percent"],
        )
        return self._out(deployment)

    @extend_schema(request=None, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def promote(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        services.deployment_promote(
            tenant=self.ctx.tenant, actor=self.ctx.actor, deployment=deployment
        )
        return self._out(deployment)

    @extend_schema(responses=CapacitySerializer)
    @action(detail=False, methods=["get"])
    def capacity(self, request: Request) -> Response:
        """The cluster's CPU, GPU and memory in use and free (Ray's accounting, at most a few
        seconds old); `known` is false when Ray cannot say. Creates and changes whose replicas
        do not fit are refused with 409 `insufficient_capacity` naming the setting, unless
        the cluster autoscales."""
        return Response(capacity_view())

    @extend_schema(responses=RevisionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def revisions(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        revisions = selectors.revision_list(tenant=self.ctx.tenant, deployment=deployment)
        return Response(RevisionSerializer(revisions, many=True).data)

    @extend_schema(request=KeyCreateSerializer, responses={201: KeyCreatedSerializer})
    @action(detail=True, methods=["get", "post"])
    def keys(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        if request.method == "GET":
            keys = selectors.inference_key_list(tenant=self.ctx.tenant, deployment=deployment)
            return Response(KeySerializer(keys, many=True).data)
        data = validated(KeyCreateSerializer, request.data)
        key, raw = services.inference_key_create(
            tenant=self.ctx.tenant, actor=self.ctx.actor, deployment=deployment, **data
        )
        body = {**KeySerializer(key).data, "key": raw}
        return Response(body, status=status.HTTP_201_CREATED)


class InferenceKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Inference keys of your tenant's deployments; POST .../revoke/ revokes one (the router
    stops accepting it as soon as the new revision is applied)."""

    queryset = InferenceKey.objects.none()
    serializer_class = KeySerializer
    action_scopes = {"*": Scope.ADMIN}

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return InferenceKey.objects.filter(tenant=tenant).order_by("-id")

    @extend_schema(request=None, responses=KeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        key = services.inference_key_revoke(
            tenant=self.ctx.tenant, actor=self.ctx.actor, key=self.get_object()
        )
        return Response(KeySerializer(key).data)
