"""django-filter filter sets of the tenants API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_filters
from django.core.exceptions import ValidationError
from django_filters.fields import IsoDateTimeField

from tenants.models import ApiToken, AuditEvent, Invitation, Membership


class UtcIsoDateTimeField(IsoDateTimeField):
    def to_python(self, value: Any) -> datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # 0001-01-01T00:00+01:00 is in year 0 in UTC
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    """ISO 8601, taken to UTC before the query: Python accepts offsets up to 24 hours,
    PostgreSQL only up to 15:59, and refused `-22:55` with a DataError (a 500)."""

    field_class = UtcIsoDateTimeField


class MembershipFilter(django_filters.FilterSet):
    email = django_filters.CharFilter(field_name="user__email", lookup_expr="iexact")

    class Meta:
        model = Membership
        fields = ["role"]


class InvitationFilter(django_filters.FilterSet):
    email = django_filters.CharFilter(lookup_expr="iexact")
    pending = django_filters.BooleanFilter(method="filter_pending")

    class Meta:
        model = Invitation
        fields = ["role"]

    def filter_pending(self, queryset, name, value):  # type: ignore[no-untyped-def]
        from django.utils import timezone

        pending = {
            "accepted_at__isnull": True,
            "revoked_at__isnull": True,
            "expired_at__isnull": True,
            "expires_at__gt": timezone.now(),
        }
        return queryset.filter(**pending) if value else queryset.exclude(**pending)


class ApiTokenFilter(django_filters.FilterSet):
    active = django_filters.BooleanFilter(method="filter_active")
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = ApiToken
        fields = ["prefix"]

    def filter_active(self, queryset, name, value):  # type: ignore[no-untyped-def]
        from django.utils import timezone

        active = {"revoked_at__isnull": True, "expires_at__gt": timezone.now()}
        return queryset.filter(**active) if value else queryset.exclude(**active)


class AuditEventFilter(django_filters.FilterSet):
    action = django_filters.CharFilter()
    action_prefix = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    actor = django_filters.CharFilter(field_name="actor_label", lookup_expr="icontains")
    created_after = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["object_type", "object_id"]
