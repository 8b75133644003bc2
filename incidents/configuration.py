"""Writes of a tenant's incident configuration: its own root-cause rules and its notification
channels. Re-exported by `incidents.services`, where callers find them."""

from __future__ import annotations

import secrets
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, transaction

from incidents.models import CauseRule, ChannelKind, NotificationChannel, RuleOp, Severity
from incidents.notify import webhook_check
from incidents.signals import SIGNAL_NAMES
from portal import netguard
from portal.exceptions import ConflictError, ValidationFailed
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

RULE_FIELDS = ("symptom", "op", "threshold", "cause", "fix", "weight", "is_active")
CHANNEL_FIELDS = ("name", "url", "email", "min_severity", "is_active")
MAX_RULES = 200
MAX_CHANNELS = 20


def clean_or_fail(obj: Any, **kwargs: Any) -> None:
    """full_clean(), with Django's errors turned into the portal's, naming the first field."""
    try:
        obj.full_clean(**kwargs)
    except ValidationError as exc:
        errors = exc.message_dict
        field = sorted(errors)[0]
        raise ValidationFailed(
            " ".join(errors[field]), field=None if field == "__all__" else field
        ) from None


def _check_rule(rule: CauseRule) -> None:
    if rule.symptom not in SIGNAL_NAMES:
        raise ValidationFailed(f"must be one of {', '.join(SIGNAL_NAMES)}.", field="symptom")
    if rule.op not in RuleOp.values:
        raise ValidationFailed(f"must be one of {', '.join(RuleOp.values)}.", field="op")
    if rule.op != RuleOp.TRUE and rule.threshold is None:
        raise ValidationFailed(f"the {rule.op!r} rule needs a threshold.", field="threshold")
    if rule.op == RuleOp.TRUE:
        rule.threshold = None
    rule.cause = (rule.cause or "").strip()
    if not rule.cause:
        raise ValidationFailed("name the likely cause.", field="cause")
    clean_or_fail(rule, exclude=["tenant"])


def _rule_snapshot(rule: CauseRule) -> dict[str, Any]:
    return {name: getattr(rule, name) for name in RULE_FIELDS}


def cause_rule_create(
    *,
    tenant: Tenant,
    actor: Actor,
    symptom: str,
    op: str,
    cause: str,
    threshold: float | None = None,
    fix: str = "",
    weight: float = 1.0,
    is_active: bool = True,
) -> CauseRule:
    """A tenant's own symptom -> cause edge of the hint graph."""
    rule = CauseRule(
        tenant=tenant,
        symptom=symptom,
        op=op,
        threshold=threshold,
        cause=cause,
        fix=fix,
        weight=weight,
        is_active=is_active,
    )
    _check_rule(rule)
    with transaction.atomic():
        if CauseRule.objects.filter(tenant=tenant).count() >= MAX_RULES:
            raise ConflictError(f"a tenant keeps at most {MAX_RULES} rules.", field="symptom")
        rule.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="cause_rule.created",
            obj=rule,
            after=_rule_snapshot(rule),
        )
    return rule


def cause_rule_update(
    *, tenant: Tenant, actor: Actor, rule: CauseRule, changes: dict[str, Any]
) -> CauseRule:
    unknown = sorted(set(changes) - set(RULE_FIELDS))
    if unknown:
        raise ValidationFailed("cannot be changed.", field=unknown[0])
    with transaction.atomic():
        locked = CauseRule.objects.select_for_update().get(pk=rule.pk, tenant=tenant)
        before = _rule_snapshot(locked)
        for name, value in changes.items():
            setattr(locked, name, value)
        _check_rule(locked)
        locked.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="cause_rule.changed",
            obj=locked,
            before=before,
            after=_rule_snapshot(locked),
        )
    return locked


def cause_rule_delete(*, tenant: Tenant, actor: Actor, rule: CauseRule) -> None:
    with transaction.atomic():
        locked = CauseRule.objects.select_for_update().get(pk=rule.pk, tenant=tenant)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="cause_rule.deleted",
            obj=locked,
            before=_rule_snapshot(locked),
        )
        locked.delete()


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
