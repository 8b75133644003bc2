"""Reads of incidents, their timelines and breaches, the tenant's rules and channels (always
inside one tenant), and the ranked root-cause hints of an incident."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet

from incidents.models import CauseRule, Incident, IncidentEvent, IncidentStatus, SlaBreach
from incidents.notifications.models import NotificationChannel, NotificationDelivery
from incidents.rca.evidence import Signals, incident_signals
from incidents.rca.hints import Hint, rank_hints
from serving.deployments.models import Deployment
from tenants.models import Tenant
from tenants.scoping import get_for_tenant


def incident_list(*, tenant: Tenant) -> QuerySet[Incident]:
    return (
        Incident.objects.filter(tenant=tenant)
        .select_related("deployment", "rollback")
        .order_by("-id")
    )


def incident_detail_list(*, tenant: Tenant) -> QuerySet[Incident]:
    """Incidents with what the detail view shows: timeline (with actors), breaches, rollback."""
    return incident_list(tenant=tenant).prefetch_related(
        Prefetch("events", queryset=IncidentEvent.objects.select_related("actor")),
        Prefetch("breaches", queryset=SlaBreach.objects.order_by("detected_at", "id")),
    )


def incident_get(*, tenant: Tenant, incident_id: Any) -> Incident:
    """One incident of `tenant`; missing and foreign ones raise the same 404."""
    return get_for_tenant(incident_list(tenant=tenant), tenant=tenant, pk=incident_id)


def incident_open_for_deployment(*, tenant: Tenant, deployment: Deployment) -> list[Incident]:
    """The deployment's unresolved incidents, newest first (the rollback code links to them)."""
    return list(
        incident_list(tenant=tenant)
        .filter(deployment=deployment)
        .exclude(status=IncidentStatus.RESOLVED)
    )


def incident_timeline(*, tenant: Tenant, incident: Incident) -> QuerySet[IncidentEvent]:
    return (
        IncidentEvent.objects.filter(tenant=tenant, incident=incident)
        .select_related("actor")
        .order_by("at", "id")
    )


def breach_list(*, tenant: Tenant) -> QuerySet[SlaBreach]:
    return SlaBreach.objects.filter(tenant=tenant).select_related("deployment").order_by("-id")


def cause_rule_list(*, tenant: Tenant, active_only: bool = False) -> QuerySet[CauseRule]:
    rules = CauseRule.objects.filter(tenant=tenant).order_by("-id")
    return rules.filter(is_active=True) if active_only else rules


def notification_channel_list(*, tenant: Tenant) -> QuerySet[NotificationChannel]:
    return NotificationChannel.objects.filter(tenant=tenant).order_by("-id")


def delivery_list(*, tenant: Tenant, incident: Incident) -> QuerySet[NotificationDelivery]:
    return NotificationDelivery.objects.filter(tenant=tenant, incident=incident).select_related(
        "channel"
    )


def incident_hints(*, tenant: Tenant, incident: Incident) -> tuple[Signals, list[Hint]]:
    """The signals around the incident and the causes they point to, best first."""
    signals = incident_signals(tenant=tenant, incident=incident)
    rules = list(cause_rule_list(tenant=tenant, active_only=True).order_by("id"))
    return signals, rank_hints(signals, rules)


def open_incidents(*, tenant: Tenant) -> QuerySet[Incident]:
    """The tenant's open (triggered or acknowledged) incidents, newest first."""
    return (
        Incident.objects.filter(
            tenant=tenant, status__in=[IncidentStatus.TRIGGERED, IncidentStatus.ACKNOWLEDGED]
        )
        .select_related("deployment")
        .order_by("-triggered_at", "-id")
    )


def open_counts_by_deployment(tenant: Tenant) -> dict[int, int]:
    """Open (triggered or acknowledged) incidents per deployment of `tenant`."""
    counts: dict[int, int] = {}
    for deployment_id in Incident.objects.filter(
        tenant=tenant, status__in=[IncidentStatus.TRIGGERED, IncidentStatus.ACKNOWLEDGED]
    ).values_list("deployment_id", flat=True):
        counts[deployment_id] = counts.get(deployment_id, 0) + 1
    return counts
