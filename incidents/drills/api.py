"""Chaos drills API: drills (CRUD; the cron schedule is part of the drill), their runs (start,
stop, timeline and report) and the fault catalogue. Starting and stopping need `deploy`."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from incidents import drills
from incidents.drills.models import (
    ChaosDrill,
    DrillEvent,
    DrillRun,
    DrillSlot,
    FaultKind,
    RevertStrategy,
)
from incidents.drills.not_offered import NOT_OFFERED
from portal.api.validation import validated
from portal.exceptions import ValidationFailed
from serving.deployments import selectors as deployment_selectors
from tenants.api.base import TenantScopedViewSet
from tenants.models import Scope, Tenant

NOT_OFFERED_CHOICES = [(name, name) for name in NOT_OFFERED]


class DrillSerializer(serializers.ModelSerializer):
    class Meta:
        model = ChaosDrill
        fields = [
            "id",
            "name",
            "description",
            "deployment",
            "fault",
            "parameters",
            "group",
            "replica_share",
            "traffic_share",
            "duration_s",
            "steady_state",
            "abort_conditions",
            "schedule",
            "revert",
            "is_active",
            "replay_prompts",
            "created_at",
        ]
        read_only_fields = fields


class DrillInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    deployment = serializers.IntegerField(help_text="a deployment of your tenant")
    # Faults the seeds name but the portal does not offer pass here, to be refused with why.
    fault = serializers.ChoiceField(choices=[*FaultKind.choices, *NOT_OFFERED_CHOICES])
    parameters = serializers.JSONField(required=False)
    group = serializers.ChoiceField(choices=DrillSlot.choices, required=False)
    replica_share = serializers.FloatField(min_value=0.01, max_value=1.0, required=False)
    traffic_share = serializers.FloatField(min_value=0.01, max_value=1.0, required=False)
    duration_s = serializers.IntegerField(min_value=5, max_value=3600, required=False)
    steady_state = serializers.JSONField(required=False)
    abort_conditions = serializers.JSONField(required=False)
    schedule = serializers.CharField(max_length=100, required=False, allow_blank=True)
    revert = serializers.ChoiceField(choices=RevertStrategy.choices, required=False)
    is_active = serializers.BooleanField(required=False)
    replay_prompts = serializers.BooleanField(
        required=False, help_text="build the fault's prompts from the tenant's recent prompts"
    )


class DrillEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = DrillEvent
        fields = ["at", "kind", "message", "data"]
        read_only_fields = fields


class DrillRunSerializer(serializers.ModelSerializer):
    mttd_s = serializers.FloatField(read_only=True, allow_null=True)
    mttr_s = serializers.FloatField(read_only=True, allow_null=True)
    detected = serializers.BooleanField(read_only=True, allow_null=True)

    class Meta:
        model = DrillRun
        fields = [
            "id",
            "drill",
            "deployment",
            "fault",
            "status",
            "trigger",
            "created_at",
            "started_at",
            "injected_at",
            "effect_at",
            "detected",
            "detected_by",
            "detected_at",
            "detection",
            "mitigated_at",
            "reverted_at",
            "finished_at",
            "mttd_s",
            "mttr_s",
            "incident",
            "fault_revision",
            "revert_revision",
            "deviated",
            "stop_requested",
            "verdict",
            "resilience_score",
            "probes",
            "snapshot",
        ]
        read_only_fields = fields


class DrillRunDetailSerializer(DrillRunSerializer):
    events = DrillEventSerializer(many=True, read_only=True)

    class Meta(DrillRunSerializer.Meta):
        fields = [*DrillRunSerializer.Meta.fields, "events"]
        read_only_fields = fields


def _deployment(tenant: Tenant, pk: Any) -> Any:
    found = deployment_selectors.deployment_list(tenant=tenant).filter(pk=pk).first()
    if found is None:
        raise ValidationFailed("no such deployment in your tenant.", field="deployment")
    return found


class DrillViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Chaos drills of your tenant. POST {id}/runs/ starts a run now (`deploy` scope)."""

    queryset = ChaosDrill.objects.none()
    serializer_class = DrillSerializer
    action_scopes = {
        "create": Scope.DEPLOY,
        "partial_update": Scope.DEPLOY,
        "destroy": Scope.DEPLOY,
        "runs": Scope.DEPLOY,
    }

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return ChaosDrill.objects.filter(tenant=tenant).order_by("name")

    @extend_schema(request=DrillInputSerializer, responses={201: DrillSerializer})
    def create(self, request: Request) -> Response:
        data = validated(DrillInputSerializer, request.data)
        deployment = _deployment(self.ctx.tenant, data.pop("deployment"))
        drill = drills.drill_create(
            tenant=self.ctx.tenant, actor=self.ctx.actor, deployment=deployment, **data
        )
        return Response(DrillSerializer(drill).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=DrillInputSerializer, responses=DrillSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        drill = self.get_object()
        data = validated(DrillInputSerializer, request.data, partial=True)
        if "deployment" in data:
            raise ValidationFailed("a drill stays on its deployment.", field="deployment")
        drill = drills.drill_update(
            tenant=self.ctx.tenant, actor=self.ctx.actor, drill=drill, **data
        )
        return Response(DrillSerializer(drill).data)

    def destroy(self, request: Request, pk: str) -> Response:
        drills.drill_delete(tenant=self.ctx.tenant, actor=self.ctx.actor, drill=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: dict})
    @action(detail=False, methods=["get"])
    def faults(self, request: Request) -> Response:
        """The fault catalogue: each fault, what it does, its parameters (range, default)."""
        return Response(drills.catalogue())

    @extend_schema(request=None, responses={201: DrillRunSerializer})
    @action(detail=True, methods=["post"])
    def runs(self, request: Request, pk: str) -> Response:
        run = drills.run_start(
            tenant=self.ctx.tenant, actor=self.ctx.actor, drill=self.get_object(), trigger="api"
        )
        return Response(DrillRunSerializer(run).data, status=status.HTTP_201_CREATED)


class DrillRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Runs of your drills, newest first; the detail has the timeline. POST {id}/stop/ reverts
    the fault and ends the run as aborted (`deploy` scope)."""

    queryset = DrillRun.objects.none()
    serializer_class = DrillRunSerializer
    action_scopes = {"stop": Scope.DEPLOY}

    def scoped_queryset(self, tenant: Tenant) -> Any:
        runs = DrillRun.objects.filter(tenant=tenant).order_by("-created_at", "-id")
        if self.action == "retrieve":
            return runs.prefetch_related("events")
        return runs

    def get_serializer_class(self) -> Any:
        return DrillRunDetailSerializer if self.action == "retrieve" else DrillRunSerializer

    @extend_schema(request=None, responses=DrillRunSerializer)
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str) -> Response:
        run = drills.run_stop(tenant=self.ctx.tenant, actor=self.ctx.actor, run=self.get_object())
        return Response(DrillRunSerializer(run).data)
