"""Notification channels (services): webhooks and e-mail a tenant's incidents go to."""

from __future__ import annotations

import secrets
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, transaction

from incidents.models import Severity
from incidents.notifications.delivery import webhook_check
from incidents.notifications.models import ChannelKind, NotificationChannel
from portal import netguard
from portal.exceptions import ConflictError, ValidationFailed
from portal.validation import clean_or_fail
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

CHANNEL_FIELDS = ("name", "url", "email", "min_severity", "is_active")


MAX_CHANNELS = 20


def _channel_snapshot(channel: NotificationChannel) -> dict[str, Any]:
    # Never the secret: audit rows are readable by every owner.
    return {"kind": channel.kind, **{name: getattr(channel, name) for name in CHANNEL_FIELDS}}


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
    if channel.kind == ChannelKind.WEBHOOK:
        channel.email = ""
    else:
        channel.url = ""
    clean_or_fail(channel, exclude=["tenant"])


def _check_webhook_url(url: str) -> None:
    """The URL is well formed and every address its host resolves to now is public (the
    delivery checks again: DNS may change). Called outside transactions: it waits on DNS."""
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        raise ValidationFailed("enter a valid http(s) URL.", field="url") from None
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
) -> tuple[NotificationChannel, str]:
    """A webhook or e-mail channel; returns it and its signing secret (shown once)."""
    raw_secret = "whsec_" + secrets.token_urlsafe(32)
    channel = NotificationChannel(
        tenant=tenant,
        kind=kind,
        name=name,
        url=url or "",
        email=(email or "").strip().lower(),
        secret=raw_secret,
        min_severity=min_severity,
        is_active=is_active,
    )
    _check_channel(channel)
    if channel.kind == ChannelKind.WEBHOOK:
        _check_webhook_url(channel.url)
    with transaction.atomic():
        if NotificationChannel.objects.filter(tenant=tenant).count() >= MAX_CHANNELS:
            raise ConflictError(f"a tenant keeps at most {MAX_CHANNELS} channels.", field="name")
        _save_channel(channel)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="notification_channel.created",
            obj=channel,
            after=_channel_snapshot(channel),
        )
    return channel, raw_secret


def notification_channel_update(
    *, tenant: Tenant, actor: Actor, channel: NotificationChannel, changes: dict[str, Any]
) -> NotificationChannel:
    unknown = sorted(set(changes) - set(CHANNEL_FIELDS))
    if unknown:
        raise ValidationFailed("cannot be changed.", field=unknown[0])
    if channel.kind == ChannelKind.WEBHOOK and changes.get("url"):
        _check_webhook_url(str(changes["url"]))  # a new URL only: the old one may be off now
    with transaction.atomic():
        locked = NotificationChannel.objects.select_for_update().get(pk=channel.pk, tenant=tenant)
        before = _channel_snapshot(locked)
        for name, value in changes.items():
            setattr(locked, name, value)
        _check_channel(locked)
        _save_channel(locked)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="notification_channel.changed",
            obj=locked,
            before=before,
            after=_channel_snapshot(locked),
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
            before=_channel_snapshot(locked),
        )
        locked.delete()
