"""Notification channels (services): the webhooks, e-mail addresses, Slack incoming webhooks
and PagerDuty integrations a tenant's incidents go to. Each kind is checked for what it needs,
the error naming the field (`url`, `email`, `routing_key`); every URL passes the outbound-URL
guard when it is set (and again at each delivery)."""

from __future__ import annotations

import re
import secrets
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, transaction

from incidents.models import Severity
from incidents.notifications.delivery import webhook_check
from incidents.notifications.models import (
    HTTPS_KINDS,
    PAGERDUTY_EVENTS_URL,
    URL_KINDS,
    ChannelKind,
    NotificationChannel,
)
from portal import netguard
from portal.exceptions import ConflictError, ValidationFailed
from portal.validation import clean_or_fail
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

CHANNEL_FIELDS = ("name", "url", "email", "min_severity", "is_active")
UPDATE_FIELDS = (*CHANNEL_FIELDS, "routing_key")


MAX_CHANNELS = 20
# An Events API v2 integration key: 32 characters (PagerDuty's reference).
ROUTING_KEY = re.compile(r"[A-Za-z0-9]{32}")


def channel_snapshot(*, channel: NotificationChannel) -> dict[str, Any]:
    # Never a secret (signing secret, routing key, a Slack URL's token): audit rows are
    # readable by every owner.
    snapshot = {"kind": channel.kind, **{name: getattr(channel, name) for name in CHANNEL_FIELDS}}
    snapshot["url"] = channel.url_shown
    if channel.kind == ChannelKind.PAGERDUTY:
        snapshot["routing_key"] = channel.routing_key_hint
    return snapshot


def _check_routing_key(kind: str, routing_key: str | None) -> str:
    """The routing key a channel of `kind` keeps, or "" for kinds that take none."""
    if kind != ChannelKind.PAGERDUTY:
        if routing_key:
            raise ValidationFailed(
                "only a PagerDuty channel takes a routing key.", field="routing_key"
            )
        return ""
    key = (routing_key or "").strip()
    if not key:
        raise ValidationFailed("a PagerDuty channel needs a routing key.", field="routing_key")
    if not ROUTING_KEY.fullmatch(key):
        raise ValidationFailed(
            "must be the 32-character integration key of an Events API v2 integration.",
            field="routing_key",
        )
    return key


def _check_channel(channel: NotificationChannel) -> None:
    channel.name = (channel.name or "").strip()
    if not channel.name:
        raise ValidationFailed("give the channel a name.", field="name")
    if channel.kind not in ChannelKind.values:
        raise ValidationFailed(f"must be one of {', '.join(ChannelKind.values)}.", field="kind")
    if channel.min_severity not in Severity.values:
        raise ValidationFailed(
            f"must be one of {', '.join(Severity.values)}.", field="min_severity"
        )
    if channel.kind in URL_KINDS:
        channel.email = ""
    else:
        channel.url = ""
    if channel.kind != ChannelKind.PAGERDUTY:
        channel.secret = channel.secret if channel.kind == ChannelKind.WEBHOOK else ""
    clean_or_fail(channel, exclude=["tenant"])


def _check_url(kind: str, url: str) -> None:
    """The URL is well formed (https for Slack and PagerDuty) and every address its host
    resolves to now is public (the delivery checks again: DNS may change). Called outside
    transactions: it waits on DNS."""
    schemes = ["https"] if kind in HTTPS_KINDS else ["http", "https"]
    if not url:
        raise ValidationFailed(f"a {ChannelKind(kind).label} channel needs a URL.", field="url")
    try:
        URLValidator(schemes=schemes)(url)
    except ValidationError:
        raise ValidationFailed(f"enter a valid {'/'.join(schemes)} URL.", field="url") from None
    try:
        webhook_check(url)
    except netguard.Refused as exc:
        raise ValidationFailed(str(exc), field="url") from None


def _save_channel(channel: NotificationChannel) -> None:
    if (
        NotificationChannel.objects.filter(tenant=channel.tenant, name=channel.name)
        .exclude(pk=channel.pk)
        .exists()
    ):
        raise ConflictError(f"a channel named {channel.name!r} exists.", field="name")
    try:
        with transaction.atomic():
            channel.save()
    except IntegrityError:
        raise ConflictError(f"a channel named {channel.name!r} exists.", field="name") from None


def notification_channel_create(
    *,
    tenant: Tenant,
    actor: Actor,
    kind: str,
    name: str,
    url: str = "",
    email: str = "",
    min_severity: str = Severity.TICKET,
    is_active: bool = True,
    routing_key: str = "",
) -> tuple[NotificationChannel, str]:
    """A channel of any kind; returns it and, for a webhook, its signing secret (shown once;
    "" for the other kinds). A PagerDuty channel posts to PagerDuty's events endpoint unless
    `url` names another (its EU endpoint, say)."""
    if kind == ChannelKind.PAGERDUTY and not url:
        url = PAGERDUTY_EVENTS_URL
    key = _check_routing_key(kind, routing_key)
    raw_secret = "whsec_" + secrets.token_urlsafe(32) if kind == ChannelKind.WEBHOOK else ""
    channel = NotificationChannel(
        tenant=tenant,
        kind=kind,
        name=name,
        url=(url or "").strip(),
        email=(email or "").strip().lower(),
        secret=raw_secret or key,
        min_severity=min_severity,
        is_active=is_active,
    )
    _check_channel(channel)
    if channel.kind in URL_KINDS:
        _check_url(channel.kind, channel.url)
    with transaction.atomic():
        if NotificationChannel.objects.filter(tenant=tenant).count() >= MAX_CHANNELS:
            raise ConflictError(f"a tenant keeps at most {MAX_CHANNELS} channels.", field="name")
        _save_channel(channel)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="notification_channel.created",
            obj=channel,
            after=channel_snapshot(channel=channel),
        )
    return channel, raw_secret


def notification_channel_update(
    *, tenant: Tenant, actor: Actor, channel: NotificationChannel, changes: dict[str, Any]
) -> NotificationChannel:
    """Change a channel's fields (not its kind). A PagerDuty routing key is replaced only
    when a new one is given."""
    unknown = sorted(set(changes) - set(UPDATE_FIELDS))
    if unknown:
        raise ValidationFailed("cannot be changed.", field=unknown[0])
    changes = dict(changes)
    routing_key = changes.pop("routing_key", None)
    if routing_key is not None:
        routing_key = _check_routing_key(channel.kind, routing_key)
    if "url" in changes:
        changes["url"] = str(changes["url"] or "").strip()
        if channel.kind == ChannelKind.PAGERDUTY and not changes["url"]:
            changes["url"] = PAGERDUTY_EVENTS_URL  # blank: PagerDuty's endpoint, as at creation
        if channel.kind in URL_KINDS:  # a new URL only: the old one may be off now
            _check_url(channel.kind, changes["url"])
    with transaction.atomic():
        locked = NotificationChannel.objects.select_for_update().get(pk=channel.pk, tenant=tenant)
        before = channel_snapshot(channel=locked)
        for name, value in changes.items():
            setattr(locked, name, value)
        if routing_key:
            locked.secret = routing_key
        _check_channel(locked)
        _save_channel(locked)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="notification_channel.changed",
            obj=locked,
            before=before,
            after=channel_snapshot(channel=locked),
        )
    return locked


def notification_channel_delete(
    *, tenant: Tenant, actor: Actor, channel: NotificationChannel
) -> None:
    with transaction.atomic():
        locked = NotificationChannel.objects.select_for_update().get(pk=channel.pk, tenant=tenant)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="notification_channel.deleted",
            obj=locked,
            before=channel_snapshot(channel=locked),
        )
        locked.delete()
