"""The ops loop of one deployment in the API (routes under deployments/{id}/): its contract
(YAML, OpenSLO), health, SLI history, feature reports, rollbacks, rollout policy and rollouts."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.validation import validated
from serving.deployments import selectors
from serving.deployments.models import Deployment
from serving.ops import contracts, health, rollbacks, rollouts
from serving.ops import selectors as ops_selectors
from serving.ops.api.serializers import (
    ContractInSerializer,
    ContractSerializer,
    FeaturesSerializer,
    PolicySerializer,
    RollbackInSerializer,
    RollbackSerializer,
    RolloutSerializer,
    RolloutStartSerializer,
    SliPointSerializer,
)
from serving.ops.models import Resolution, RolloutPolicy
from serving.ops.remediation.selectors import remediation_run_list
from serving.ops.remediation.serializers import RemediationRunSerializer
from tenants.api.base import TenantScopedViewSet
from tenants.models import Scope, Tenant


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
                return Response(
                    {"error": {"code": "not_found", "message": "no contract yet", "fields": {}}},
                    status=404,
                )
            return Response(ContractSerializer(current).data)
        data = validated(ContractInSerializer, request.data)
        row = contracts.contract_set(
            tenant=self.ctx.tenant,
            actor=self.ctx.actor,
            deployment=deployment,
            source=data["source"],
        )
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
                return Response(
                    {"error": {"code": "not_found", "message": "no contract yet", "fields": {}}},
                    status=404,
                )
            text = contracts.contract_export_openslo(
                contract=current, service=f"{self.ctx.tenant.slug}-{deployment.name}"
            )
            return HttpResponse(text, content_type="application/yaml")
        data = validated(ContractInSerializer, request.data)
        row, warnings = contracts.contract_import_openslo(
            tenant=self.ctx.tenant,
            actor=self.ctx.actor,
            deployment=deployment,
            text=data["source"],
        )
        return Response({**ContractSerializer(row).data, "warnings": warnings})

    @extend_schema(responses={200: str})
    @action(detail=True, methods=["get"], url_path="contract/rules")
    def contract_rules(self, request: Request, pk: str) -> Any:
        """The contract in force as Prometheus rules over the series /metrics exports:
        Sloth-style error ratios and multiwindow burn-rate alerts, YAML `groups:`."""
        deployment = self.get_object()
        current = contracts.contract_current(tenant=self.ctx.tenant, deployment=deployment)
        if current is None:
            return Response(
                {"error": {"code": "not_found", "message": "no contract yet", "fields": {}}},
                status=404,
            )
        entry = (self.ctx.tenant.slug, deployment.name, current)
        text = contracts.contract_export_rules(entries=[entry])
        return HttpResponse(text, content_type="application/yaml")

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
        rows = ops_selectors.sli_window(
            tenant=self.ctx.tenant,
            deployment=deployment,
            resolution=resolution,
            seconds=minutes * 60,
        )
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
            tenant=self.ctx.tenant,
            deployment=deployment,
            drift=data.get("drift"),
            freshness=data.get("freshness"),
        )
        return Response(merged)

    @extend_schema(request=RollbackInSerializer, responses=RollbackSerializer(many=True))
    @action(detail=True, methods=["get", "post"])
    def rollbacks(self, request: Request, pk: str) -> Response:
        """GET: the deployment's rollbacks. POST: roll back now (one click; no analysis)."""
        deployment = self.get_object()
        if request.method == "GET":
            rows = ops_selectors.rollback_list(tenant=self.ctx.tenant, deployment=deployment)
            return Response(RollbackSerializer(rows[:100], many=True).data)
        data = validated(RollbackInSerializer, request.data)
        target_id = None
        if "revision" in data:
            target = deployment.revisions.filter(number=data["revision"]).first()
            if target is None:
                raise serializers.ValidationError({"revision": "no such revision"})
            target_id = target.pk
        rollback, created = rollbacks.rollback_request(
            tenant=self.ctx.tenant,
            deployment=deployment,
            trigger="manual",
            reason=data["reason"],
            actor=self.ctx.actor,
            to_revision_id=target_id,
        )
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(RollbackSerializer(rollback).data, status=code)

    @extend_schema(responses=RemediationRunSerializer(many=True))
    @action(detail=True, methods=["get"])
    def remediation(self, request: Request, pk: str) -> Response:
        """The deployment's remediation runs (newest 50), each with the steps it took."""
        runs = remediation_run_list(tenant=self.ctx.tenant, deployment=self.get_object())
        return Response(RemediationRunSerializer(runs, many=True).data)

    @extend_schema(request=PolicySerializer, responses=PolicySerializer)
    @action(detail=True, methods=["get", "put"], url_path="rollout-policy")
    def rollout_policy(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        if request.method == "GET":
            policy = ops_selectors.policy_get(tenant=self.ctx.tenant, deployment=deployment)
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
            rows = ops_selectors.rollout_list(tenant=self.ctx.tenant, deployment=deployment)
            return Response(RolloutSerializer(rows[:50], many=True).data)
        data = validated(RolloutStartSerializer, request.data)
        rollout = rollouts.rollout_start(
            tenant=self.ctx.tenant,
            actor=self.ctx.actor,
            deployment=deployment,
            version_id=data["version"],
        )
        return Response(RolloutSerializer(rollout).data, status=status.HTTP_201_CREATED)
