"""Checks of a version before a canary in the API: POST models/{m}/versions/{v}/verify/ and
.../benchmark/ queue one (202 with its id), GET version-checks/{id}/ shows its result."""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from serving.ops.checks import selectors, services
from serving.ops.checks.models import CheckKind, VersionCheck
from serving.registry import selectors as registry
from serving.registry.models import ModelVersion
from tenants.api.base import RateLimited, TenantScopedViewSet
from tenants.models import Tenant


class VersionCheckSerializer(serializers.ModelSerializer):
    model = serializers.IntegerField(source="version.model_id", read_only=True)
    version_label = serializers.CharField(source="version.label", read_only=True)

    class Meta:
        model = VersionCheck
        fields = [
            "id",
            "kind",
            "status",
            "model",
            "version",
            "version_label",
            "deployment",
            "params",
            "verdict",
            "result",
            "draft",
            "error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class CheckRequestSerializer(serializers.Serializer):
    """Documents the body; limits.clean_params checks it (each bad field named)."""

    deployment_id = serializers.IntegerField(required=False, help_text="verify: whose contract")
    concurrency = serializers.IntegerField(required=False, help_text="verify: 1 to 8")
    concurrencies = serializers.ListField(
        child=serializers.IntegerField(), required=False, help_text="benchmark: e.g. [1, 4, 8]"
    )
    requests = serializers.IntegerField(required=False, help_text="per level, at most 64")
    max_tokens = serializers.IntegerField(required=False, help_text="at most 32")
    duration_s = serializers.IntegerField(required=False, help_text="per level, at most 60")
    prompts = serializers.ListField(child=serializers.CharField(), required=False)
    gates = serializers.DictField(child=serializers.CharField(), required=False)
    drift_sample = serializers.DictField(required=False, help_text="{feature, values}")


class VersionCheckStartViewSet(TenantScopedViewSet):
    """Queue a check of one ready version (routes under models/{m}/versions/{v}/)."""

    queryset = ModelVersion.objects.none()
    serializer_class = VersionCheckSerializer
    # URL kwarg -> attribute of a version holding the parent's id (the route matrices use it).
    parent_lookups: ClassVar[dict[str, str]] = {"model_pk": "model_id"}

    def scoped_queryset(self, tenant: Tenant) -> Any:
        model = registry.model_get(tenant=tenant, pk=self.kwargs["model_pk"])
        return registry.version_list(tenant=tenant, model=model)

    def _start(self, request: Request, kind: str) -> Response:
        version = self.get_object()
        wait = services.version_check_throttle(tenant=self.ctx.tenant)
        if wait > 0:
            raise RateLimited(wait=wait)
        check = services.version_check_start(
            tenant=self.ctx.tenant,
            actor=self.ctx.actor,
            version=version,
            kind=kind,
            params=request.data,
        )
        return Response(VersionCheckSerializer(check).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=CheckRequestSerializer, responses={202: VersionCheckSerializer})
    @action(detail=True, methods=["post"])
    def verify(self, request: Request, model_pk: str, pk: str) -> Response:
        """Load-test the version against the deployment's contract and check drift."""
        return self._start(request, CheckKind.VERIFY)

    @extend_schema(request=CheckRequestSerializer, responses={202: VersionCheckSerializer})
    @action(detail=True, methods=["post"])
    def benchmark(self, request: Request, model_pk: str, pk: str) -> Response:
        """Measure tokens/s and TTFT at several concurrencies and draft a contract."""
        return self._start(request, CheckKind.BENCHMARK)


class VersionCheckViewSet(mixins.RetrieveModelMixin, TenantScopedViewSet):
    """One check of your tenant: poll until `status` is `done` or `failed`."""

    queryset = VersionCheck.objects.none()
    serializer_class = VersionCheckSerializer

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.version_check_list(tenant=tenant)
