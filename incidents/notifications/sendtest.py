"""A channel's test message, sent on demand through the same outbound path and guard as the
incidents' deliveries: a signed webhook (X-Portal-Event `test`), a short Slack message, a
PagerDuty `trigger` of severity `info` resolved at once, or an e-mail. Throttled per channel and
per tenant (each test reaches someone else's server); refused for a switched-off channel or a
suspended tenant; audited, with the outcome (never the receiver's body)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from incidents.notifications import formats
from incidents.notifications.delivery import Answer, post, send_email, webhook_headers
from incidents.notifications.models import ChannelKind, NotificationChannel
from incidents.notifications.selectors import TESTED
from incidents.notifications.services import channel_snapshot
from portal import ratelimit
from portal.exceptions import ConflictError, QuotaExceeded
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

# A hostile tenant pointing its channels at a victim gets this much traffic out of us at most:
# one test per channel per PER_CHANNEL_S, PER_TENANT tests per tenant per PER_TENANT_S.
PER_CHANNEL_S = 10
PER_TENANT = 5
PER_TENANT_S = 60
TEST_TYPE = "test"


@dataclass(frozen=True)
class SendResult:
    """What the receiver answered: its status code (None for e-mail or when nothing answered)
    and the error ("" when sent)."""

    channel: NotificationChannel
    code: int | None
    error: str

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def summary(self) -> str:
        name = self.channel.name
        if self.ok:
            answer = f" (HTTP {self.code})" if self.code is not None else ""
            return f"Test message sent to {name}{answer}."
        return f"Test message to {name} failed: {self.error}"


def _page_url(tenant: Tenant) -> str:
    path = reverse("notification-channels", kwargs={"slug": tenant.slug})
    return str(settings.PORTAL_BASE_URL).rstrip("/") + path


def _text(channel: NotificationChannel, tenant: Tenant) -> str:
    return (
        f"Test message from the {formats.PORTAL_CLIENT} for the channel "
        f"{channel.name!r} of {tenant.slug}: incidents will arrive here. No action needed."
    )


def _body(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _send_webhook(channel: NotificationChannel, tenant: Tenant, test_id: str) -> Answer:
    body = _body(
        {
            "delivery": test_id,
            "type": TEST_TYPE,
            "channel": {"id": channel.pk, "name": channel.name},
            "tenant": tenant.slug,
            "message": _text(channel, tenant),
            "sent_at": timezone.now().isoformat(),
            "url": _page_url(tenant),
        }
    )
    headers = webhook_headers(secret=channel.secret, delivery_id=test_id, body=body)
    return post(channel.url, body, headers)


def _send_slack(channel: NotificationChannel, tenant: Tenant) -> Answer:
    text = formats.mrkdwn(formats.cut(_text(channel, tenant), formats.SLACK_TEXT_MAX))
    return post(channel.url, _body({"text": f"{text} <{_page_url(tenant)}|channels>"}), {})


def _send_pagerduty(channel: NotificationChannel, tenant: Tenant, test_id: str) -> Answer:
    """A `trigger` of severity info, then a `resolve` of its key, so nobody stays paged."""
    key = f"aiops-portal/tenant-{tenant.pk}/channel-test-{channel.pk}-{test_id}"
    trigger = {
        "routing_key": channel.secret,
        "event_action": "trigger",
        "dedup_key": key,
        "payload": {
            "summary": formats.cut(_text(channel, tenant), formats.PD_SUMMARY_MAX),
            "source": formats.cut(f"{tenant.slug}/portal", 255),
            "severity": "info",
            "timestamp": timezone.now().isoformat(),
            "component": "notifications",
            "group": "test",
            "class": TEST_TYPE,
            "custom_details": {"channel": channel.name, "test": True},
        },
        "client": formats.PORTAL_CLIENT,
        "client_url": _page_url(tenant),
    }
    answer = post(channel.url, _body(trigger), {})
    if answer.code is None:  # nothing reached PagerDuty: nothing to resolve
        return answer
    resolve = {"routing_key": channel.secret, "event_action": "resolve", "dedup_key": key}
    resolved = post(channel.url, _body(resolve), {})
    if answer.error or not resolved.error:
        return answer
    return Answer(
        answer.code, f"triggered (HTTP {answer.code}), but its resolve failed: {resolved.error}"
    )


def _send_email(channel: NotificationChannel, tenant: Tenant) -> Answer:
    subject = formats.cut(f"[test] {formats.PORTAL_CLIENT}: channel {channel.name}", 200)
    body = f"{_text(channel, tenant)}\n{_page_url(tenant)}"
    return Answer(None, send_email(address=channel.email, subject=subject, body=body))


def _refuse_if_not_sendable(tenant: Tenant, channel: NotificationChannel) -> None:
    # Read from the rows, not the caller's copies: a suspension or switch-off is seen at once.
    if not Tenant.objects.filter(pk=tenant.pk, is_active=True).exists():
        raise ConflictError("the tenant is suspended: its channels send nothing.")
    if not channel.is_active:
        raise ConflictError(
            f"the channel {channel.name!r} is switched off: switch it on to send a test.",
            field="is_active",
        )


def _throttle(tenant: Tenant, channel: NotificationChannel) -> None:
    wait = ratelimit.throttle(
        [
            ratelimit.Bucket(f"channel-test:{channel.pk}", 1 / PER_CHANNEL_S, burst=1),
            ratelimit.Bucket(
                f"channel-test-tenant:{tenant.pk}", PER_TENANT / PER_TENANT_S, burst=PER_TENANT
            ),
        ]
    )
    if wait > 0:
        raise QuotaExceeded(
            f"too many test messages (one per channel every {PER_CHANNEL_S} s, {PER_TENANT} "
            f"per tenant a minute): try again in {max(1, round(wait))} s."
        )


def notification_channel_test(
    *, tenant: Tenant, actor: Actor, channel: NotificationChannel
) -> SendResult:
    """Send `channel` a test message of its kind now and audit the outcome. Raises
    ConflictError (switched off, tenant suspended) or QuotaExceeded (throttled) before
    sending anything."""
    channel = NotificationChannel.objects.get(pk=channel.pk, tenant=tenant)
    _refuse_if_not_sendable(tenant, channel)
    _throttle(tenant, channel)
    test_id = f"test-{secrets.token_hex(8)}"
    if channel.kind == ChannelKind.EMAIL:
        answer = _send_email(channel, tenant)
    elif channel.kind == ChannelKind.SLACK:
        answer = _send_slack(channel, tenant)
    elif channel.kind == ChannelKind.PAGERDUTY:
        answer = _send_pagerduty(channel, tenant, test_id)
    else:
        answer = _send_webhook(channel, tenant, test_id)
    result = SendResult(channel, answer.code, answer.error)
    audit_record(
        tenant=tenant,
        actor=actor,
        action=TESTED,
        obj=channel,
        after={
            **channel_snapshot(channel=channel),
            "result": "sent" if result.ok else "failed",
            "response_code": result.code,
            "error": result.error,
        },
    )
    return result
