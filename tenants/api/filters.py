"""django-filter filter sets of the tenants API."""

from __future__ import annotations

import django_filters

from tenants.models import ApiToken, AuditEvent, Invitation, Membership


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
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["object_type", "object_id"]
