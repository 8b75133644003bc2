"""Incidents (models): SLA breaches, incidents with their append-only timeline, the tenants'
own root-cause rules, notification channels and their deliveries."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models
from django.utils import timezone

from incidents.models import SEVERITY_RANK, Incident, IncidentEvent, Severity
from tenants.scoping import TenantOwned


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook", "Webhook"
    EMAIL = "email", "E-mail"


class NotificationChannel(TenantOwned):
    """Where a tenant is told about incidents: a signed webhook or an e-mail address."""

    kind = models.CharField(max_length=10, choices=ChannelKind.choices)
    name = models.CharField(max_length=80)
    url = models.URLField(
        max_length=500, blank=True, validators=[URLValidator(schemes=["http", "https"])]
    )
    email = models.EmailField(blank=True)
    secret = models.CharField(max_length=80)  # signs webhook bodies; shown once at creation
    min_severity = models.CharField(
        max_length=10, choices=Severity.choices, default=Severity.TICKET
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="channel_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def clean(self) -> None:
        super().clean()
        if self.kind == ChannelKind.WEBHOOK and not self.url:
            raise ValidationError({"url": "a webhook channel needs an http(s) URL."})
        if self.kind == ChannelKind.EMAIL and not self.email:
            raise ValidationError({"email": "an e-mail channel needs an address."})

    def admits(self, severity: str) -> bool:
        return SEVERITY_RANK.get(severity, 0) >= SEVERITY_RANK.get(self.min_severity, 0)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"


class NotificationDelivery(TenantOwned):
    """One event of one incident sent to one channel, with its attempts."""

    channel = models.ForeignKey(
        NotificationChannel, on_delete=models.CASCADE, related_name="deliveries"
    )
    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(
        IncidentEvent, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "channel", "event"], name="delivery_once_per_event"
            )
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} to {self.channel_id} ({self.status})"
