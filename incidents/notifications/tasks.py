"""Celery tasks of notifications: delivery, the retry sweep and a channel's test message."""

from __future__ import annotations

from typing import Any

from incidents.notifications import delivery as notify
from incidents.notifications import sendtest
from portal.celery import task


@task(
    name="incidents.deliver_notification",
    queue="default",
    time_limit=30,
    idempotent=True,
    bind=True,
    max_retries=notify.MAX_ATTEMPTS,
)
def deliver_notification(self: Any, delivery_id: int) -> str:
    """Send one notification; retried with exponential backoff (2**attempts s) while the
    receiver is down or answers 5xx/429. A gone or finished delivery is left alone; one of a
    suspended tenant (or a switched-off channel) ends failed without being sent."""
    outcome = notify.delivery_attempt(delivery_id=delivery_id)
    if outcome.retry_in is not None:
        raise self.retry(countdown=outcome.retry_in)
    return outcome.status


@task(name="incidents.sweep_notifications", queue="default", time_limit=60, idempotent=True)
def sweep_notifications() -> int:
    """Beat, every minute: deliveries whose task was lost are sent again."""
    return len(notify.deliveries_sweep())


@task(name="incidents.send_channel_test", queue="default", time_limit=60)
def send_channel_test(
    channel_id: int, test_id: str, user_id: int | None = None, token_id: int | None = None
) -> str:
    """Send one queued test message (a page's "Send test"): not idempotent (a retry would send
    a second message), so it is acknowledged at once. A removed channel is left alone."""
    result = sendtest.channel_test_send(
        channel_id=channel_id, test_id=test_id, user_id=user_id, token_id=token_id
    )
    if result is None:
        return "gone"
    return "sent" if result.ok else "failed"
