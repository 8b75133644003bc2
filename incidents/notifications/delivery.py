"""Telling people about incidents: the live pages (a Channels group per tenant) and the
tenant's notification channels (signed webhooks, e-mail, Slack, PagerDuty; their formats in
`formats`), delivered by a Celery task with retries and exponential backoff. Deliveries are at
least once; webhook receivers deduplicate on the `X-Portal-Delivery` header, PagerDuty on the
incident's dedup_key.

A webhook, Slack message or PagerDuty event is posted only to public addresses
(`portal.netguard`, plus the networks the platform allows in WEBHOOK_ALLOWED_NETWORKS): each
attempt resolves the host once, checks every address and connects to a checked one (the Host
header and TLS name stay the URL's), follows no redirect and keeps only the receiver's status
code, never its body. A suspended tenant's deliveries are not sent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any

import httpx
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from incidents.models import Incident, IncidentEvent
from incidents.notifications import formats
from incidents.notifications.models import (
    ChannelKind,
    DeliveryStatus,
    NotificationChannel,
    NotificationDelivery,
)
from portal import netguard
from tenants.models import Tenant

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 6
TIMEOUT_S = 5.0
USER_AGENT = "aiops-portal-webhooks/1"
CONNECT_TRIES = 3  # addresses of a host tried per attempt; each may take TIMEOUT_S to fail


def group_name(tenant_id: int) -> str:
    """The Channels group of a tenant's incident stream."""
    return f"tenant-{tenant_id}.incidents"


def broadcast_on_commit(incident: Incident, kind: str) -> None:
    """Tell the live pages after commit; a channel layer that is down is logged, not raised."""
    message = {
        "type": "incident.updated",
        "incident": incident.pk,
        "status": incident.status,
        "event": kind,
    }
    group = group_name(incident.tenant_id)

    def send() -> None:
        try:
            layer = get_channel_layer()
            if layer is not None:
                async_to_sync(layer.group_send)(group, message)
        except Exception as exc:  # the write stands; the page catches up on its next load
            logger.warning("incident event not broadcast to %s: %s", group, exc)

    transaction.on_commit(send)


def deliveries_create(
    *, tenant: Tenant, incident: Incident, event: IncidentEvent
) -> list[NotificationDelivery]:
    """One delivery per active channel that admits the incident's severity, inside the
    caller's transaction; each is sent by a task once the transaction commits."""
    from incidents.notifications.tasks import deliver_notification

    # A suspended tenant is told nothing (read from the row, not the caller's copy).
    channels = NotificationChannel.objects.filter(
        tenant=tenant, is_active=True, tenant__is_active=True
    )
    deliveries = [
        NotificationDelivery.objects.create(
            tenant=tenant, channel=channel, incident=incident, event=event
        )
        for channel in channels
        if channel.admits(incident.severity)
    ]
    for delivery in deliveries:
        transaction.on_commit(_enqueue(deliver_notification, delivery.pk))
    return deliveries


def _enqueue(task: Any, delivery_id: int) -> Callable[[], None]:
    def send() -> None:
        task.delay(delivery_id)

    return send


def sign(secret: str, timestamp: str, body: str) -> str:
    """`sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>` (Stripe's scheme)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


@dataclass(frozen=True)
class Outcome:
    status: str  # sent | pending (retry) | failed | skipped
    retry_in: int | None = None


def webhook_allowed_networks() -> tuple[netguard.Network, ...]:
    """The non-public networks the platform lets webhooks reach (none by default)."""
    try:
        return netguard.parse_networks(getattr(settings, "WEBHOOK_ALLOWED_NETWORKS", ()))
    except ValueError as exc:
        raise ImproperlyConfigured(f"WEBHOOK_ALLOWED_NETWORKS: {exc}") from None


def webhook_check(url: str) -> netguard.Target:
    """Resolve the URL's host once and check every address; netguard.Refused says why not."""
    return netguard.check_url(url, allowed=webhook_allowed_networks(), what="webhooks")


@cache
def _tls_context() -> ssl.SSLContext:
    # Certificates are checked against the URL's host name (sent as SNI), not the address.
    return httpx.create_ssl_context(trust_env=False)


@dataclass(frozen=True)
class Answer:
    code: int | None
    error: str  # empty on 2xx; never the receiver's body
    retryable: bool = False


def _describe(exc: Exception) -> str:
    if isinstance(exc, httpx.RemoteProtocolError | httpx.DecodingError):
        return f"{type(exc).__name__}: the receiver's answer was not valid HTTP."
    text = " ".join("".join(c if c.isprintable() else " " for c in str(exc)).split())
    return f"{type(exc).__name__}: {text}"[:300]


def _judge(code: int) -> Answer:
    if 200 <= code < 300:
        return Answer(code, "")
    if 300 <= code < 400:
        return Answer(code, f"HTTP {code}: redirects are not followed.")
    return Answer(code, f"HTTP {code}", retryable=code >= 500 or code == 429)


def webhook_headers(*, secret: str, delivery_id: str, body: str) -> dict[str, str]:
    """The signed webhook's headers; X-Portal-Event is the body's `type`."""
    timestamp = str(int(time.time()))
    return {
        "X-Portal-Event": json.loads(body)["type"],
        "X-Portal-Delivery": delivery_id,
        "X-Portal-Timestamp": timestamp,
        "X-Portal-Signature": sign(secret, timestamp, body),
    }


def post(url: str, body: str, extra_headers: dict[str, str]) -> Answer:
    """POST the JSON body to one of the addresses checked for this attempt (no second
    lookup); the receiver's answer is judged by its status code alone, its body never read."""
    try:
        target = webhook_check(url)
    except netguard.Unresolvable as exc:  # DNS may come back: retried
        return Answer(None, f"not sent: {exc}", retryable=True)
    except netguard.Refused as exc:
        return Answer(None, f"refused: {exc}")
    headers = {
        "Host": target.host_header,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        **extra_headers,
    }
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    failure = Answer(None, "not sent: no address to connect to.", retryable=True)
    with httpx.Client(
        verify=_tls_context(), trust_env=False, follow_redirects=False, timeout=TIMEOUT_S
    ) as client:
        for address in target.addresses[:CONNECT_TRIES]:
            try:
                with client.stream(
                    "POST",
                    target.url_for(address),
                    content=body.encode(),
                    headers=headers,
                    extensions=extensions,
                ) as response:
                    return _judge(response.status_code)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing sent: next one
                failure = Answer(None, _describe(exc), retryable=True)
            except httpx.HTTPError as exc:
                return Answer(None, _describe(exc), retryable=True)
            except httpx.InvalidURL as exc:
                return Answer(None, _describe(exc))
    return failure


def _not_sendable(delivery: NotificationDelivery) -> str:
    """Why a pending delivery must not go out any more, or ""."""
    if not delivery.tenant.is_active:
        return "tenant suspended: not sent."
    if not delivery.channel.is_active:
        return "channel switched off: not sent."
    return ""


def send_email(*, address: str, subject: str, body: str) -> str:
    """Send one e-mail; the error ("" when sent)."""
    try:
        send_mail(subject=subject, message=body, from_email=None, recipient_list=[address])
    except Exception as exc:  # SMTP and socket errors: retried like a 5xx
        return f"{type(exc).__name__}: {exc}"[:500]
    return ""


def _send(delivery: NotificationDelivery) -> Answer:
    """One try of the channel's kind: the signed webhook, Slack's incoming webhook and
    PagerDuty's Events API go through the outbound-URL guard; e-mail through SMTP."""
    channel = delivery.channel
    f = formats.facts(delivery)
    if channel.kind == ChannelKind.EMAIL:
        subject, text = formats.email_message(f)
        error = send_email(address=channel.email, subject=subject, body=text)
        return Answer(None, error, retryable=bool(error))
    if channel.kind == ChannelKind.SLACK:
        data = formats.slack_message(f)
    elif channel.kind == ChannelKind.PAGERDUTY:
        data = formats.pagerduty_event(f, routing_key=channel.secret)
    else:
        data = formats.webhook_payload(delivery, f)
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    if channel.kind == ChannelKind.WEBHOOK:
        headers = webhook_headers(secret=channel.secret, delivery_id=str(delivery.pk), body=body)
        return post(channel.url, body, headers)
    return post(channel.url, body, {})


def delivery_attempt(*, delivery_id: int) -> Outcome:
    """One attempt of one delivery. Connection errors, 5xx and 429 are retried after
    2**attempts seconds, up to MAX_ATTEMPTS; any other answer is final."""
    delivery = (
        NotificationDelivery.objects.select_related(
            "tenant", "channel", "incident", "event", "incident__first_breach"
        )
        .filter(pk=delivery_id)
        .first()
    )
    if delivery is None or delivery.status != DeliveryStatus.PENDING:
        return Outcome("skipped")
    halt = _not_sendable(delivery)
    if halt:
        NotificationDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.FAILED, last_error=halt
        )
        logger.info("notification %s not sent: %s", delivery.pk, halt)
        return Outcome(DeliveryStatus.FAILED)
    answer = _send(delivery)
    code, error, retryable = answer.code, answer.error, answer.retryable
    attempts = delivery.attempts + 1
    now = timezone.now()
    if not error:
        status, retry_in = DeliveryStatus.SENT, None
    elif retryable and attempts < MAX_ATTEMPTS:
        status, retry_in = DeliveryStatus.PENDING, 2**attempts
    else:
        status, retry_in = DeliveryStatus.FAILED, None
    NotificationDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING).update(
        status=status,
        attempts=attempts,
        last_error=error,
        response_code=code,
        sent_at=now if status == DeliveryStatus.SENT else None,
        next_attempt_at=now + timedelta(seconds=retry_in or 0),
    )
    if error:
        logger.warning(
            "notification %s to channel %s, attempt %s: %s",
            delivery.pk,
            delivery.channel_id,
            attempts,
            error,
        )
    return Outcome(status, retry_in)


SWEEP_GRACE_S = 120  # an attempt this far past due lost its task


def deliveries_sweep(*, now: Any = None, limit: int = 500) -> list[int]:
    """Send again the pending deliveries whose task was lost: the broker was down when the
    incident committed, or a worker died holding the retry. Each is claimed (its next attempt
    moved on by the grace) under a row lock that concurrent sweeps skip, so one sweep sends it
    once; a task that was merely late may still make the delivery arrive twice, which the
    receivers' dedupe on `X-Portal-Delivery` covers."""
    from incidents.notifications.tasks import deliver_notification

    now = now or timezone.now()
    grace = timedelta(seconds=SWEEP_GRACE_S)
    with transaction.atomic():
        ids = list(
            NotificationDelivery.objects.select_for_update(skip_locked=True)
            .filter(status=DeliveryStatus.PENDING, next_attempt_at__lt=now - grace)
            .order_by("next_attempt_at")
            .values_list("pk", flat=True)[:limit]
        )
        NotificationDelivery.objects.filter(pk__in=ids).update(next_attempt_at=now + grace)
        for delivery_id in ids:
            transaction.on_commit(_enqueue(deliver_notification, delivery_id))
    if ids:
        logger.warning("%s notification deliveries had lost their task: sent again", len(ids))
    return ids
