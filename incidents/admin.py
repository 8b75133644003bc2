"""Admin screens for platform staff: the incidents room, read-only (writes go through the
services). Channel secrets never show."""

from typing import Any

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from incidents.models import CauseRule, Incident, IncidentEvent, SlaBreach
from incidents.notifications.models import NotificationChannel, NotificationDelivery


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Incident)
class IncidentAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "title", "severity", "status", "is_drill", "triggered_at"]
    list_filter = ["status", "severity", "is_drill"]
    list_select_related = ["tenant"]
    search_fields = ["title", "dedup_key"]


@admin.register(IncidentEvent)
class IncidentEventAdmin(ReadOnlyAdmin):
    list_display = ["incident", "at", "kind", "actor_label", "message"]
    list_filter = ["kind"]


@admin.register(SlaBreach)
class SlaBreachAdmin(ReadOnlyAdmin):
    list_display = [
        "tenant",
        "objective",
        "group",
        "kind",
        "severity",
        "detected_at",
        "occurrences",
    ]
    list_filter = ["kind", "severity", "group"]
    list_select_related = ["tenant"]


@admin.register(CauseRule)
class CauseRuleAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "symptom", "op", "threshold", "cause", "weight", "is_active"]


@admin.register(NotificationChannel)
class NotificationChannelAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "name", "kind", "min_severity", "is_active"]
    exclude = ["secret"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(ReadOnlyAdmin):
    list_display = ["id", "channel", "incident", "status", "attempts", "response_code", "sent_at"]
    list_filter = ["status"]
