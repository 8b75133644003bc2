"""django-filter filter sets of the incidents API (ids filter inside the caller's tenant: the
querysets are scoped, and a plain number filter never looks another tenant's row up)."""

from __future__ import annotations

import django_filters

from incidents.models import CauseRule, Incident, SlaBreach
from incidents.notifications.models import NotificationChannel


class IncidentFilter(django_filters.FilterSet):
    deployment = django_filters.NumberFilter(field_name="deployment_id")

    class Meta:
        model = Incident
        fields = ["status", "severity", "is_drill"]


class BreachFilter(django_filters.FilterSet):
    deployment = django_filters.NumberFilter(field_name="deployment_id")
    incident = django_filters.NumberFilter(field_name="incident_id")

    class Meta:
        model = SlaBreach
        fields = ["group", "kind", "severity"]


class CauseRuleFilter(django_filters.FilterSet):
    class Meta:
        model = CauseRule
        fields = ["symptom", "is_active"]


class NotificationChannelFilter(django_filters.FilterSet):
    class Meta:
        model = NotificationChannel
        fields = ["kind", "is_active"]
