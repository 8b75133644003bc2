"""Celery tasks of notifications: delivery and the retry sweep."""

from __future__ import annotations

from typing import Any

from incidents.notifications import delivery as notify
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
