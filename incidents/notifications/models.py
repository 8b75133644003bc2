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
    SLACK = "slack", "Slack"
    PAGERDUTY = "pagerduty", "PagerDuty"


# The kinds posted over the network (the outbound-URL guard checks their URL), and those that
# only ever speak https (Slack's incoming webhooks, PagerDuty's Events API v2).
URL_KINDS = frozenset({ChannelKind.WEBHOOK, ChannelKind.SLACK, ChannelKind.PAGERDUTY})
HTTPS_KINDS = frozenset({ChannelKind.SLACK, ChannelKind.PAGERDUTY})
PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


def hint(value: str) -> str:
    """A secret shown back: its last four characters only."""
    return f"****{value[-4:]}" if value else ""


class NotificationChannel(TenantOwned):
    """Where a tenant is told about incidents: a signed webhook, an e-mail address, a Slack
    incoming webhook or a PagerDuty Events API v2 integration. `secret` is the webhook's signing
    secret or the PagerDuty routing key; neither is shown back after creation (a hint only)."""

    kind = models.CharField(max_length=10, choices=ChannelKind.choices)
    name = models.CharField(max_length=80)
    url = models.URLField(
        max_length=500, blank=True, validators=[URLValidator(schemes=["http", "https"])]
    )
    email = models.EmailField(blank=True)
    # Signs webhook bodies (shown once at creation) or is the PagerDuty routing key (never
    # shown back); empty for e-mail and Slack (a Slack webhook URL carries its own token).
    secret = models.CharField(max_length=80, blank=True)
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
        if self.kind in HTTPS_KINDS and not self.url.lower().startswith("https://"):
            raise ValidationError(
                {"url": f"a {self.get_kind_display()} channel needs an https URL."}
            )
        if self.kind == ChannelKind.EMAIL and not self.email:
            raise ValidationError({"email": "an e-mail channel needs an address."})
        if self.kind == ChannelKind.PAGERDUTY and not self.secret:
            raise ValidationError({"routing_key": "a PagerDuty channel needs a routing key."})

    @property
    def url_shown(self) -> str:
        """The URL as read back: a Slack webhook URL is a credential, so only its host and
        the last four characters of its path are shown."""
        if self.kind != ChannelKind.SLACK or not self.url:
            return self.url
        scheme, _, rest = self.url.partition("://")
        host = rest.split("/", 1)[0]
        return f"{scheme}://{host}/{hint(self.url)}"

    @property
    def routing_key_hint(self) -> str:
        return hint(self.secret) if self.kind == ChannelKind.PAGERDUTY else ""

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
