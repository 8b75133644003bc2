"""Incidents API: short declarations on the scoped base; rules live in services/selectors."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from incidents import analytics, selectors, services
from incidents.api import filters
from incidents.api import learning as ls
from incidents.api import serializers as s
from incidents.models import CauseRule, Incident, SlaBreach
from incidents.notifications.models import NotificationChannel
from incidents.rca import selectors as rca
from incidents.rca.postmortem import postmortem_markdown
from incidents.rca.selectors import voter_id
from incidents.rca.services_feedback import hint_feedback_set
from incidents.rca.similar import similar_incidents
from portal.api.validation import validated
from tenants.api.base import TenantScopedViewSet
from tenants.models import Scope, Tenant


class IncidentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Incidents of your tenant, opened by SLA breaches (and drills). POST acknowledge/,
    mitigate/, resolve/ move one forward; notes/ adds to its timeline."""

    queryset = Incident.objects.none()
    serializer_class = s.IncidentSerializer
    filterset_class = filters.IncidentFilter
    action_scopes = {
        "acknowledge": Scope.WRITE,
        "mitigate": Scope.WRITE,
        "resolve": Scope.WRITE,
        "notes": Scope.WRITE,
        "timeline": Scope.READ,
        "hints": Scope.READ,
        "hint_feedback": Scope.WRITE,
        "similar": Scope.READ,
        "analytics": Scope.READ,
        "postmortem": Scope.READ,
    }

    def scoped_queryset(self, tenant: Tenant) -> Any:
        if self.action == "retrieve":
            return selectors.incident_detail_list(tenant=tenant)
        return selectors.incident_list(tenant=tenant)

    def get_serializer_class(self) -> Any:
        return s.IncidentDetailSerializer if self.action == "retrieve" else s.IncidentSerializer

    def _out(self, incident: Incident) -> Response:
        fresh = selectors.incident_list(tenant=self.ctx.tenant).get(pk=incident.pk)
        return Response(s.IncidentSerializer(fresh).data)

    @extend_schema(request=None, responses=s.IncidentSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: str) -> Response:
        incident = services.incident_acknowledge(
            tenant=self.ctx.tenant, actor=self.ctx.actor, incident=self.get_object()
        )
        return self._out(incident)

    @extend_schema(request=None, responses=s.IncidentSerializer)
    @action(detail=True, methods=["post"])
    def mitigate(self, request: Request, pk: str) -> Response:
        incident = services.incident_mitigate(
            tenant=self.ctx.tenant, actor=self.ctx.actor, incident=self.get_object()
        )
        return self._out(incident)

    @extend_schema(request=None, responses=s.IncidentSerializer)
    @action(detail=True, methods=["post"])
    def resolve(self, request: Request, pk: str) -> Response:
        incident = services.incident_resolve(
            tenant=self.ctx.tenant, actor=self.ctx.actor, incident=self.get_object()
        )
        return self._out(incident)

    @extend_schema(request=s.NoteSerializer, responses={201: s.EventSerializer})
    @action(detail=True, methods=["post"])
    def notes(self, request: Request, pk: str) -> Response:
        incident = self.get_object()
        data = validated(s.NoteSerializer, request.data)
        event = services.incident_note(
            tenant=self.ctx.tenant, actor=self.ctx.actor, incident=incident, text=data["text"]
        )
        return Response(s.EventSerializer(event).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=s.EventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def timeline(self, request: Request, pk: str) -> Response:
        events = selectors.incident_timeline(tenant=self.ctx.tenant, incident=self.get_object())
        return Response(s.EventSerializer(events, many=True).data)

    @extend_schema(responses=s.HintsSerializer)
    @action(detail=True, methods=["get"])
    def hints(self, request: Request, pk: str) -> Response:
        """Hints re-ranked by your team's votes (muted apart), and what Serve said."""
        analysis = rca.incident_analysis(
            tenant=self.ctx.tenant, incident=self.get_object(), user_id=voter_id(self.ctx.actor)
        )
        return Response(analysis.as_dict())

    @extend_schema(request=ls.HintFeedbackInputSerializer, responses=ls.HintWeightSerializer)
    @action(detail=True, methods=["post"], url_path="hint-feedback")
    def hint_feedback(self, request: Request, pk: str) -> Response:
        """Mark a hint right or wrong (again to change it, '' to take it back): the cause's
        weight changes for your tenant only."""
        incident = self.get_object()  # someone else's is a 404 whatever the body
        data = validated(ls.HintFeedbackInputSerializer, request.data)
        weight = hint_feedback_set(
            tenant=self.ctx.tenant, actor=self.ctx.actor, incident=incident, **data
        )
        return Response(ls.HintWeightSerializer(weight).data)

    @extend_schema(responses=ls.SimilarSerializer(many=True))
    @action(detail=True, methods=["get"])
    def similar(self, request: Request, pk: str) -> Response:
        """Your past incidents with the same symptoms (same deployment or version first)."""
        incident = self.get_object()
        analysis = rca.incident_analysis(tenant=self.ctx.tenant, incident=incident)
        causes = [h.cause for h in analysis.hints]
        found = similar_incidents(tenant=self.ctx.tenant, incident=incident, causes=causes)
        return Response([asdict(f) for f in found])

    @extend_schema(parameters=[ls.AnalyticsQuerySerializer], responses=ls.AnalyticsSerializer)
    @action(detail=False, methods=["get"])
    def analytics(self, request: Request) -> Response:
        """Incidents per week by severity, MTTD / MTTR p50 and p95 (real and drills apart),
        availability per deployment."""
        query = validated(ls.AnalyticsQuerySerializer, request.query_params)
        data = analytics.incident_analytics(
            tenant=self.ctx.tenant, weeks=query["weeks"], window_days=query["days"]
        )
        return Response(ls.AnalyticsSerializer(data).data)

    @extend_schema(
        responses={
            (200, "text/markdown"): OpenApiResponse(
                response=OpenApiTypes.STR, description="the postmortem as Markdown"
            )
        }
    )
    @action(detail=True, methods=["get"])
    def postmortem(self, request: Request, pk: str) -> HttpResponse:
        incident = self.get_object()
        text = postmortem_markdown(tenant=self.ctx.tenant, incident=incident)
        response = HttpResponse(text, content_type="text/markdown; charset=utf-8")
        response["Content-Disposition"] = f'inline; filename="incident-{incident.pk}.md"'
        return response


class BreachViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """SLA breaches of your tenant's deployments (read-only; the health checks record them)."""

    queryset = SlaBreach.objects.none()
    serializer_class = s.BreachSerializer
    filterset_class = filters.BreachFilter

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.breach_list(tenant=tenant)


class CauseRuleViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Your own root-cause rules (symptom -> cause -> fix); they join the built-in graph."""

    queryset = CauseRule.objects.none()
    serializer_class = s.CauseRuleSerializer
    filterset_class = filters.CauseRuleFilter

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.cause_rule_list(tenant=tenant)

    @extend_schema(request=s.CauseRuleInputSerializer, responses={201: s.CauseRuleSerializer})
    def create(self, request: Request) -> Response:
        data = validated(s.CauseRuleInputSerializer, request.data)
        rule = services.cause_rule_create(tenant=self.ctx.tenant, actor=self.ctx.actor, **data)
        return Response(s.CauseRuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.CauseRuleInputSerializer, responses=s.CauseRuleSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        rule = self.get_object()
        data = validated(s.CauseRuleInputSerializer, request.data, partial=True)
        rule = services.cause_rule_update(
            tenant=self.ctx.tenant, actor=self.ctx.actor, rule=rule, changes=data
        )
        return Response(s.CauseRuleSerializer(rule).data)

    def destroy(self, request: Request, pk: str) -> Response:
        services.cause_rule_delete(
            tenant=self.ctx.tenant, actor=self.ctx.actor, rule=self.get_object()
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class NotificationChannelViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet
):
    """Where incidents are announced: webhooks (JSON, signed `X-Portal-Signature: sha256=HMAC
    of "<X-Portal-Timestamp>.<body>"`), e-mail, Slack incoming webhooks and PagerDuty (Events
    API v2). A webhook's secret is shown once, at creation; a PagerDuty routing key never."""

    queryset = NotificationChannel.objects.none()
    serializer_class = s.ChannelSerializer
    filterset_class = filters.NotificationChannelFilter

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.notification_channel_list(tenant=tenant)

    @extend_schema(request=s.ChannelCreateSerializer, responses={201: s.ChannelCreatedSerializer})
    def create(self, request: Request) -> Response:
        data = validated(s.ChannelCreateSerializer, request.data)
        channel, secret = services.notification_channel_create(
            tenant=self.ctx.tenant, actor=self.ctx.actor, **data
        )
        body = {**s.ChannelSerializer(channel).data, **({"secret": secret} if secret else {})}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ChannelUpdateSerializer, responses=s.ChannelSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        channel = self.get_object()
        data = validated(s.ChannelUpdateSerializer, request.data, partial=True)
        channel = services.notification_channel_update(
            tenant=self.ctx.tenant, actor=self.ctx.actor, channel=channel, changes=data
        )
        return Response(s.ChannelSerializer(channel).data)

    def destroy(self, request: Request, pk: str) -> Response:
        services.notification_channel_delete(
            tenant=self.ctx.tenant, actor=self.ctx.actor, channel=self.get_object()
        )
        return Response(status=status.HTTP_204_NO_CONTENT)
