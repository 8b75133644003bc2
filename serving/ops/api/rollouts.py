"""Rollouts and rollbacks of the tenant's deployments in the API: lists, details, and a
rollout's pause, resume, confirm and abort."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from serving.ops import rollouts
from serving.ops import selectors as ops_selectors
from serving.ops.api.serializers import RollbackSerializer, RolloutSerializer
from serving.ops.models import Rollback, Rollout
from tenants.api.base import TenantScopedViewSet
from tenants.models import Scope, Tenant


class RolloutViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Progressive rollouts; POST pause/, resume/, confirm/ (a gate's needs_review), abort/
    (rolls back to the revision the canary started from)."""

    queryset = Rollout.objects.none()
    serializer_class = RolloutSerializer
    action_scopes = {
        "pause": Scope.DEPLOY,
        "resume": Scope.DEPLOY,
        "confirm": Scope.DEPLOY,
        "abort": Scope.DEPLOY,
    }

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return ops_selectors.rollout_list(tenant=tenant)

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
        return ops_selectors.rollback_list(tenant=tenant)
