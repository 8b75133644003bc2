"""Incidents (models): SLA breaches, incidents with their append-only timeline, the tenants'
own root-cause rules, notification channels and their deliveries."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwned

DEPLOYMENT = "serving.Deployment"


class Severity(models.TextChoices):
    PAGE = "page", "Page"
    TICKET = "ticket", "Ticket"


# A channel with min_severity X is told of incidents whose rank is at least X's.
SEVERITY_RANK: dict[str, int] = {Severity.TICKET: 1, Severity.PAGE: 2}


class BreachGroup(models.TextChoices):
    STABLE = "stable", "Stable"
    CANARY = "canary", "Canary"
    ALL = "all", "All traffic"


class BreachKind(models.TextChoices):
    BURN = "burn", "Burn rate"
    FAST = "fast", "Fast burn"
    GAUGE = "gauge", "Gauge"
    BUDGET = "budget", "Error budget"
    PROBE = "probe", "Probe"
    ANALYSIS = "analysis", "Canary analysis"
    GATE = "gate", "Promotion gate"
    DRIFT = "drift", "Config drift"
    RELOAD = "reload", "Failed reload"


class BreachAction(models.TextChoices):
    ROLLBACK = "rollback", "Roll back"
    PAUSE = "pause", "Pause"
    NOTIFY = "notify", "Notify"
    # The remediation actions (serving.slo.remediation): the alert starts a one-step run.
    SCALE_OUT = "scale_out", "Scale out"
    RESTART_REPLICAS = "restart_replicas", "Restart replicas"
    SHED_LOAD = "shed_load", "Shed load"
    SWITCH_TO_FALLBACK = "switch_to_fallback", "Switch to fallback"


class IncidentStatus(models.TextChoices):
    TRIGGERED = "triggered", "Triggered"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    MITIGATED = "mitigated", "Mitigated"
    RESOLVED = "resolved", "Resolved"


# Stages in order, each with its timestamp field; a stage may be skipped, never revisited.
STAGES = [
    (IncidentStatus.TRIGGERED, "triggered_at"),
    (IncidentStatus.ACKNOWLEDGED, "acknowledged_at"),
    (IncidentStatus.MITIGATED, "mitigated_at"),
    (IncidentStatus.RESOLVED, "resolved_at"),
]


class EventKind(models.TextChoices):
    BREACH = "breach", "SLA breach"
    ROLLBACK_STARTED = "rollback_started", "Rollback started"
    ROLLBACK_FINISHED = "rollback_finished", "Rollback finished"
    STATUS_CHANGED = "status_changed", "Status changed"
    ESCALATED = "escalated", "Severity raised"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    NOTE = "note", "Note"
    NOTIFICATION = "notification", "Notification"
    HINT = "hint", "Hint"
    ANALYSIS = "analysis", "Analysis"
    REMEDIATION = "remediation", "Remediation step"


class SlaBreach(TenantOwned):
    """One objective (or rule) of a deployment's contract found breached. Repeats of the same
    breach while its incident is open bump `occurrences` and `last_seen_at`."""

    deployment = models.ForeignKey(DEPLOYMENT, on_delete=models.CASCADE, related_name="+")
    group = models.CharField(max_length=10, choices=BreachGroup.choices)
    contract_version = models.PositiveIntegerField(null=True, blank=True)
    objective = models.CharField(max_length=120)
    kind = models.CharField(max_length=10, choices=BreachKind.choices)
    severity = models.CharField(max_length=10, choices=Severity.choices)
    action = models.CharField(max_length=20, choices=BreachAction.choices)
    detail = models.TextField(blank=True)
    burn_long = models.FloatField(null=True, blank=True)
    burn_short = models.FloatField(null=True, blank=True)
    observed = models.JSONField(default=dict, blank=True)
    detected_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    occurrences = models.PositiveIntegerField(default=1)
    dedup_key = models.CharField(max_length=200, db_index=True)
    incident = models.ForeignKey(
        "Incident", null=True, blank=True, on_delete=models.SET_NULL, related_name="breaches"
    )

    class Meta:
        ordering = ["-detected_at"]

    def __str__(self) -> str:
        return f"{self.objective} ({self.group}) breached at {self.detected_at:%Y-%m-%d %H:%M}"


class Incident(TenantOwned):
    """Something is wrong with a deployment: opened by a breach (or a drill), moved through
    triggered -> acknowledged -> mitigated -> resolved; stages may be skipped, never undone."""

    deployment = models.ForeignKey(
        DEPLOYMENT, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    title = models.CharField(max_length=200)
    severity = models.CharField(max_length=10, choices=Severity.choices)
    status = models.CharField(
        max_length=12, choices=IncidentStatus.choices, default=IncidentStatus.TRIGGERED
    )
    triggered_at = models.DateTimeField(default=timezone.now)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    mitigated_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    dedup_key = models.CharField(max_length=200, db_index=True)
    is_drill = models.BooleanField(default=False)
    drill_run_id = models.PositiveBigIntegerField(null=True, blank=True)
    rollback = models.ForeignKey(
        "serving.Rollback", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    first_breach = models.ForeignKey(
        SlaBreach, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    summary = models.TextField(blank=True)

    class Meta:
        ordering = ["-triggered_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "dedup_key"],
                # Mitigated incidents take no new breaches: a recurrence after a rollback is a
                # new incident (and may roll back again); see incidents.services.
                condition=models.Q(status__in=["triggered", "acknowledged"]),
                name="incident_one_open_per_key",
            )
        ]
        indexes = [models.Index(fields=["tenant", "status"], name="incident_by_status")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"

    def clean(self) -> None:
        super().clean()
        previous: tuple[str, Any] | None = None
        reached = 0
        for index, (_, field) in enumerate(STAGES):
            value = getattr(self, field)
            if value is None:
                continue
            reached = index
            if previous is not None and value < previous[1]:
                raise ValidationError({field: f"must not be before {previous[0]}."})
            previous = (field, value)
        stage_of: dict[str, int] = {str(status): i for i, (status, _) in enumerate(STAGES)}
        expected = STAGES[reached][0]
        if self.status not in stage_of or stage_of[self.status] != reached:
            raise ValidationError(
                {"status": f"is {self.status!r} but the timestamps say {expected!r}."}
            )

    @property
    def is_open(self) -> bool:
        return self.status != IncidentStatus.RESOLVED

    @property
    def time_to_mitigate(self) -> Any:
        end = self.mitigated_at or self.resolved_at
        return None if end is None else end - self.triggered_at


class AppendOnlyQuerySet(models.QuerySet["IncidentEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise TypeError("the incident timeline is append-only: events are never updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise TypeError("the incident timeline is append-only: events are never deleted")


class IncidentEvent(TenantOwned):
    """One entry of an incident's timeline. Append-only: written once, never changed."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=20, choices=EventKind.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=200, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["incident", "at"], name="incident_event_timeline")]

    def __str__(self) -> str:
        return f"{self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise TypeError("the incident timeline is append-only: events are never updated")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise TypeError("the incident timeline is append-only: events are never deleted")


class RuleOp(models.TextChoices):
    GT = "gt", ">"
    GTE = "gte", ">="
    LT = "lt", "<"
    LTE = "lte", "<="
    EQ = "eq", "=="
    TRUE = "true", "is true"


class CauseRule(TenantOwned):
    """A tenant's own edge of the root-cause graph: when `symptom op threshold` holds, `cause`
    is likely and `fix` is the suggestion. The symptom is one of the signal names
    (`incidents.signals.SIGNAL_NAMES`)."""

    symptom = models.CharField(max_length=60)
    op = models.CharField(max_length=4, choices=RuleOp.choices)
    threshold = models.FloatField(null=True, blank=True)
    cause = models.CharField(max_length=200)
    fix = models.TextField(blank=True)
    weight = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.0), MaxValueValidator(10.0)]
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.symptom} {self.op} {self.threshold} -> {self.cause}"


# The notification and drill models live in their rooms; imported here so Django registers them.
from incidents.drills.models import (  # noqa: E402, F401
    ChaosDrill,
    DrillEvent,
    DrillRun,
    DrillSlot,
    DrillStatus,
    FaultKind,
    RevertStrategy,
)
from incidents.notifications.models import (  # noqa: E402, F401
    ChannelKind,
    DeliveryStatus,
    NotificationChannel,
    NotificationDelivery,
)
from incidents.rca.models import HintFeedback, HintWeight, Verdict  # noqa: E402, F401
