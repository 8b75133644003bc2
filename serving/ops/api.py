"""The ops loop in the API: contracts (YAML, OpenSLO), health, SLI history, rollbacks,
rollout policy and rollouts of a deployment."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.validation import validated
from serving.deployments import selectors
from serving.deployments.models import Deployment
from serving.ops import contracts, health, rollbacks, rollouts
from serving.ops.models import Resolution, Rollback, Rollout, RolloutPolicy, SlaContract, SliSample
from tenants.api.base import TenantScopedViewSet
from tenants.models import Scope, Tenant


class ContractSerializer(serializers.ModelSerializer):
    class Meta:
        model = SlaContract
        fields = ["id", "version", "name", "source", "document", "created_at"]
        read_only_fields = fields


class ContractInSerializer(serializers.Serializer):
    source = serializers.CharField(
        trim_whitespace=False, max_length=64 * 1024, help_text="the contract as YAML"
    )


class RollbackSerializer(serializers.ModelSerializer):
    from_revision = serializers.IntegerField(source="from_revision.number", read_only=True)
    to_revision = serializers.IntegerField(source="to_revision.number", read_only=True)
    new_revision = serializers.IntegerField(
        source="new_revision.number", read_only=True, allow_null=True, default=None
    )
    deployment = serializers.IntegerField(source="deployment_id", read_only=True)

    class Meta:
        model = Rollback
        fields = [
            "id", "deployment", "key", "trigger", "reason", "status", "error", "from_revision",
            "to_revision", "new_revision", "detected_at", "started_at", "traffic_switched_at",
            "finished_at", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class RollbackInSerializer(serializers.Serializer):
    revision = serializers.IntegerField(
        min_value=1, required=False, help_text="revision number to go back to; default: the "
        "last good revision, else the previous stable version",
    )  # fmt: skip
    reason = serializers.CharField(max_length=500, required=False, default="manual rollback")


class StepSerializer(serializers.Serializer):
    weight = serializers.FloatField(min_value=0.1, max_value=100)
    pause_s = serializers.FloatField(min_value=0, max_value=86400, default=0)


class PolicySerializer(serializers.ModelSerializer):
    steps = StepSerializer(many=True)

    class Meta:
        model = RolloutPolicy
        fields = [
            "steps", "analysis_interval_s", "failure_limit", "consecutive_error_limit",
            "min_requests", "on_failure", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["updated_at"]


class RolloutSerializer(serializers.ModelSerializer):
    deployment = serializers.IntegerField(source="deployment_id", read_only=True)
    canary_version = serializers.StringRelatedField()
    base_revision = serializers.IntegerField(source="base_revision.number", read_only=True)
    analyses = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = [
            "id", "deployment", "canary_version", "base_revision", "status", "step_index",
            "steps", "step_started_at", "failures", "consecutive_errors", "message",
            "started_at", "finished_at", "analyses",
        ]  # fmt: skip
        read_only_fields = fields

    def get_analyses(self, obj: Rollout) -> list[dict[str, Any]]:
        return [
            {"step": a.step_index, "at": a.at, "result": a.result, "summary": a.summary,
             "measurements": a.measurements}
            for a in list(obj.analyses.all())[:20]
        ]  # fmt: skip


class RolloutStartSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, help_text="id of a ready model version")


class FeaturesSerializer(serializers.Serializer):
    drift = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField(min_value=0)), required=False,
        help_text="feature -> counts per bin of the contract's reference histogram",
    )  # fmt: skip
    freshness = serializers.DictField(
        child=serializers.FloatField(min_value=0), required=False,
        help_text="feature -> when it was last updated (epoch seconds)",
    )  # fmt: skip


class SliPointSerializer(serializers.ModelSerializer):
    class Meta:
        model = SliSample
        fields = [
            "group", "version", "start", "end", "requests", "errors", "rejected", "tokens_out",
            "latency", "ttft", "itl", "probe_ok", "probe_ms", "kv",
        ]  # fmt: skip
        read_only_fields = fields


class DeploymentOpsViewSet(TenantScopedViewSet):
    """The ops loop of one deployment (routes under deployments/{id}/)."""

    queryset = Deployment.objects.none()
    serializer_class = ContractSerializer

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.deployment_list(tenant=tenant)

    def required_scope(self) -> str:
        """Reading needs `read`; every change (contract, rollback, policy, rollout) `deploy`."""
        if self.request.method in ("GET", "HEAD", "OPTIONS"):
            return str(Scope.READ)
        return str(Scope.DEPLOY)

    @extend_schema(request=ContractInSerializer, responses=ContractSerializer)
    @action(detail=True, methods=["get", "put"])
    def contract(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        if request.method == "GET":
            current = contracts.contract_current(tenant=self.ctx.tenant, deployment=deployment)
            if current is None:
                return Response({"error": {"code": "not_found", "message": "no contract yet",
                                           "fields": {}}}, status=404)  # fmt: skip
            return Response(ContractSerializer(current).data)
        data = validated(ContractInSerializer, request.data)
        row = contracts.contract_set(
            tenant=self.ctx.tenant, actor=self.ctx.actor, deployment=deployment,
            source=data["source"],
        )  # fmt: skip
        return Response(ContractSerializer(row).data)

    @extend_schema(responses=ContractSerializer(many=True))
    @action(detail=True, methods=["get"], url_path="contract/versions")
    def contract_versions(self, request: Request, pk: str) -> Response:
        rows = contracts.contract_list(tenant=self.ctx.tenant, deployment=self.get_object())
        return Response(ContractSerializer(rows, many=True).data)

    @extend_schema(request=ContractInSerializer, responses={200: str})
    @action(detail=True, methods=["get", "post"], url_path="contract/openslo")
    def openslo(self, request: Request, pk: str) -> Any:
        deployment = self.get_object()
        if request.method == "GET":
            current = contracts.contract_current(tenant=self.ctx.tenant, deployment=deployment)
            if current is None:
                return Response({"error": {"code": "not_found", "message": "no contract yet",
                                           "fields": {}}}, status=404)  # fmt: skip
            text = contracts.contract_export_openslo(
                contract=current, service=f"{self.ctx.tenant.slug}-{deployment.name}"
            )
            return HttpResponse(text, content_type="application/yaml")
        data = validated(ContractInSerializer, request.data)
        row, warnings = contracts.contract_import_openslo(
            tenant=self.ctx.tenant, actor=self.ctx.actor, deployment=deployment,
            text=data["source"],
        )  # fmt: skip
        return Response({**ContractSerializer(row).data, "warnings": warnings})

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def health(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        return Response({"deployment": deployment.pk, **health.deployment_health(deployment.pk)})

    @extend_schema(
        parameters=[
            OpenApiParameter("minutes", int, description="how far back (default 15, max 43200)"),
            OpenApiParameter("group", str, description="stable or canary (default both)"),
        ],
        responses=SliPointSerializer(many=True),
    )
    @action(detail=True, methods=["get"])
    def sli(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        try:
            minutes = int(request.query_params.get("minutes", 15))
        except ValueError:
            raise serializers.ValidationError({"minutes": "a whole number of minutes"}) from None
        if not 1 <= minutes <= 43200:
            raise serializers.ValidationError({"minutes": "between 1 and 43200"})
        resolution = Resolution.RAW if minutes <= 60 else Resolution.MINUTE
        rows = SliSample.objects.filter(
            tenant=self.ctx.tenant, deployment=deployment, resolution=resolution,
            end__gte=timezone.now() - timedelta(minutes=minutes),
        ).order_by("end")  # fmt: skip
        group = request.query_params.get("group")
        if group:
            if group not in ("stable", "canary"):
                raise serializers.ValidationError({"group": "stable or canary"})
            rows = rows.filter(group=group)
        return Response(SliPointSerializer(rows[:5000], many=True).data)

    @extend_schema(request=FeaturesSerializer, responses=FeaturesSerializer)
    @action(detail=True, methods=["post"])
    def features(self, request: Request, pk: str) -> Response:
        """Report feature drift (histogram counts) and freshness for the contract's drift and
        freshness objectives; the next health tick evaluates them."""
        deployment = self.get_object()
        data = validated(FeaturesSerializer, request.data)
        merged = contracts.features_report(
            tenant=self.ctx.tenant, deployment=deployment, drift=data.get("drift"),
            freshness=data.get("freshness"),
        )  # fmt: skip
        return Response(merged)

    @extend_schema(request=RollbackInSerializer, responses=RollbackSerializer(many=True))
    @action(detail=True, methods=["get", "post"])
    def rollbacks(self, request: Request, pk: str) -> Response:
        """GET: the deployment's rollbacks. POST: roll back now (one click; no analysis)."""
        deployment = self.get_object()
        if request.method == "GET":
            rows = Rollback.objects.filter(tenant=self.ctx.tenant, deployment=deployment)
            rows = rows.select_related("from_revision", "to_revision", "new_revision")
            return Response(RollbackSerializer(rows[:100], many=True).data)
        data = validated(RollbackInSerializer, request.data)
        target_id = None
        if "revision" in data:
            target = deployment.revisions.filter(number=data["revision"]).first()
            if target is None:
                raise serializers.ValidationError({"revision": "no such revision"})
            target_id = target.pk
        rollback, created = rollbacks.rollback_request(
            tenant=self.ctx.tenant, deployment=deployment, trigger="manual",
            reason=data["reason"], actor=self.ctx.actor, to_revision_id=target_id,
        )  # fmt: skip
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(RollbackSerializer(rollback).data, status=code)

    @extend_schema(request=PolicySerializer, responses=PolicySerializer)
    @action(detail=True, methods=["get", "put"], url_path="rollout-policy")
    def rollout_policy(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        if request.method == "GET":
            policy = RolloutPolicy.objects.filter(
                tenant=self.ctx.tenant, deployment=deployment
            ).first()
            return Response(PolicySerializer(policy or RolloutPolicy()).data)
        data = validated(PolicySerializer, request.data)
        data["steps"] = [dict(step) for step in data["steps"]]
        policy = rollouts.policy_set(
            tenant=self.ctx.tenant, actor=self.ctx.actor, deployment=deployment, values=data
        )
        return Response(PolicySerializer(policy).data)

    @extend_schema(request=RolloutStartSerializer, responses=RolloutSerializer(many=True))
    @action(detail=True, methods=["get", "post"])
    def rollouts(self, request: Request, pk: str) -> Response:
        """GET: the deployment's rollouts. POST: start a progressive rollout of a version."""
        deployment = self.get_object()
        if request.method == "GET":
            rows = Rollout.objects.filter(tenant=self.ctx.tenant, deployment=deployment)
            rows = rows.select_related("canary_version__model", "base_revision")
            return Response(RolloutSerializer(rows.prefetch_related("analyses")[:50],
                                              many=True).data)  # fmt: skip
        data = validated(RolloutStartSerializer, request.data)
        rollout = rollouts.rollout_start(
            tenant=self.ctx.tenant, actor=self.ctx.actor, deployment=deployment,
            version_id=data["version"],
        )  # fmt: skip
        return Response(RolloutSerializer(rollout).data, status=status.HTTP_201_CREATED)


class RolloutViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Progressive rollouts; POST pause/, resume/, confirm/ (a gate's needs_review), abort/
    (rolls back to the revision the canary started from)."""

    queryset = Rollout.objects.none()
    serializer_class = RolloutSerializer
    action_scopes = {
        "pause": Scope.DEPLOY, "resume": Scope.DEPLOY, "confirm": Scope.DEPLOY,
        "abort": Scope.DEPLOY,
    }  # fmt: skip

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return (
            Rollout.objects.filter(tenant=tenant)
            .select_related("canary_version__model", "base_revision", "deployment")
            .prefetch_related("analyses")
            .order_by("-started_at")
        )

    def _do(self, service: Any) -> Response:
        rollout = service(tenant=self.ctx.tenant, actor=self.ctx.actor, rollout=self.get_object())
        rollout.refresh_from_db()
        return Response(RolloutSerializer(rollout).data)

    @extend_schema(request=None, responses=RolloutSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str) -> Response:
        return self._do(rollouts.rollout_pause)

    @extend_schema(request=None, responses=RolloutSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        return self._do(rollouts.rollout_resume)

    @extend_schema(request=None, responses=RolloutSerializer)
    @action(detail=True, methods=["post"])
    def confirm(self, request: Request, pk: str) -> Response:
        return self._do(rollouts.rollout_confirm)

    @extend_schema(request=None, responses=RolloutSerializer)
    @action(detail=True, methods=["post"])
    def abort(self, request: Request, pk: str) -> Response:
        return self._do(rollouts.rollout_abort)


class RollbackViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Every rollback of your tenant's deployments, newest first."""

    queryset = Rollback.objects.none()
    serializer_class = RollbackSerializer

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return (
            Rollback.objects.filter(tenant=tenant)
            .select_related("from_revision", "to_revision", "new_revision")
            .order_by("-created_at")
        )
