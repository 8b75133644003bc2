"""A channel's test message, sent on demand through the same outbound path and guard as the
incidents' deliveries: a signed webhook (X-Portal-Event `test`), a short Slack message, a
PagerDuty `trigger` of severity `info` resolved at once, or an e-mail. Throttled per channel and
per tenant (each test reaches someone else's server, and each queued test is worker time);
refused for a switched-off channel or a suspended tenant; audited, with the outcome (never the
receiver's body).

The request (`notification_channel_test`) only checks, charges the buckets, marks the channel
"sending" and queues `incidents.send_channel_test` on commit: the outbound HTTP (up to three
5 s connects) runs in a worker, never in a web request. The worker (`channel_test_send`)
re-checks the channel, sends, audits the outcome (the channels page's "Last test") and clears
the mark."""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from incidents.notifications import formats
from incidents.notifications.delivery import Answer, post, send_email, webhook_headers
from incidents.notifications.models import ChannelKind, NotificationChannel
from incidents.notifications.selectors import SENDING_S, TESTED, sending_key
from incidents.notifications.services import channel_snapshot
from portal import ratelimit
from portal.exceptions import ConflictError, RateLimited
from tenants.actors import SYSTEM, Actor
from tenants.models import ApiToken, Tenant
from tenants.services import audit_record

logger = logging.getLogger(__name__)

# A hostile tenant pointing its channels at a victim gets this much traffic out of us at most,
# and queues this many tests for the workers at most: one test per channel per PER_CHANNEL_S,
# PER_TENANT tests per tenant per PER_TENANT_S.
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
        raise RateLimited(
            f"too many test messages (one per channel every {PER_CHANNEL_S} s, {PER_TENANT} "
            f"per tenant a minute): try again in {max(1, round(wait))} s.",
            wait=wait,
        )


@dataclass(frozen=True)
class ChannelTestQueued:
    """A test the request queued: the worker sends it; its outcome shows in the channel's row."""

    channel: NotificationChannel
    test_id: str

    @property
    def summary(self) -> str:
        return (
            f"Sending a test message to {self.channel.name}…; its outcome shows in the "
            "channel's Last test column."
        )


def notification_channel_test(
    *, tenant: Tenant, actor: Actor, channel: NotificationChannel
) -> ChannelTestQueued:
    """Queue a test message of `channel`'s kind (sent by a worker, `channel_test_send`).
    Raises ConflictError (switched off, tenant suspended) or RateLimited (throttled) before
    queueing anything; sends nothing itself."""
    from incidents.notifications.tasks import send_channel_test

    channel = NotificationChannel.objects.get(pk=channel.pk, tenant=tenant)
    _refuse_if_not_sendable(tenant, channel)
    _throttle(tenant, channel)
    test_id = f"test-{secrets.token_hex(8)}"
    try:
        cache.set(sending_key(tenant.pk, channel.pk), test_id, timeout=SENDING_S)
    except Exception as exc:  # the mark is for the page only: a cache that is down costs it
        logger.warning("channel test mark unavailable: %s", exc)
    user_id, token_id = actor.user_id, actor.token.pk if actor.token is not None else None
    transaction.on_commit(lambda: send_channel_test.delay(channel.pk, test_id, user_id, token_id))
    return ChannelTestQueued(channel, test_id)


def _actor(tenant: Tenant, user_id: int | None, token_id: int | None) -> Actor:
    """Who asked for the test, re-read (the audit row names them); the system when gone."""
    if token_id is not None:
        token = ApiToken.objects.filter(pk=token_id, tenant=tenant).first()
        if token is not None:
            return Actor(token=token)
    if user_id is not None:
        user = get_user_model().objects.filter(pk=user_id).first()
        if user is not None:
            return Actor(user=user)
    return SYSTEM


def channel_test_send(
    *, channel_id: int, test_id: str, user_id: int | None = None, token_id: int | None = None
) -> SendResult | None:
    """The worker's half: send the queued test now and audit the outcome. A channel removed
    since is left alone (None); one switched off (or a tenant suspended) since is audited as
    failed without sending."""
    channel = NotificationChannel.objects.select_related("tenant").filter(pk=channel_id).first()
    if channel is None:
        return None
    tenant = channel.tenant
    try:
        try:
            _refuse_if_not_sendable(tenant, channel)
        except ConflictError as exc:
            answer = Answer(None, f"not sent: {exc.message}")
        else:
            answer = _send(channel, tenant, test_id)
        result = SendResult(channel, answer.code, answer.error)
        audit_record(
            tenant=tenant,
            actor=_actor(tenant, user_id, token_id),
            action=TESTED,
            obj=channel,
            after={
                **channel_snapshot(channel=channel),
                "result": "sent" if result.ok else "failed",
                "response_code": result.code,
                "error": result.error,
                "test": test_id,
            },
        )
    finally:
        _unmark(tenant, channel, test_id)
    return result


def _send(channel: NotificationChannel, tenant: Tenant, test_id: str) -> Answer:
    if channel.kind == ChannelKind.EMAIL:
        return _send_email(channel, tenant)
    if channel.kind == ChannelKind.SLACK:
        return _send_slack(channel, tenant)
    if channel.kind == ChannelKind.PAGERDUTY:
        return _send_pagerduty(channel, tenant, test_id)
    return _send_webhook(channel, tenant, test_id)


def _unmark(tenant: Tenant, channel: NotificationChannel, test_id: str) -> None:
    """Clear the channel's "sending" mark if it is this test's (a newer test keeps its own)."""
    key = sending_key(tenant.pk, channel.pk)
    try:
        if cache.get(key) == test_id:
            cache.delete(key)
    except Exception as exc:
        logger.warning("channel test mark unavailable: %s", exc)
