"""Celery tasks of the incidents room: thin wrappers that take ids and call services."""

from __future__ import annotations

from typing import Any

from incidents import notify
from portal.celery import task


@task(queue="default", time_limit=30, idempotent=True, bind=True, max_retries=notify.MAX_ATTEMPTS)
def deliver_notification(self: Any, delivery_id: int) -> str:
    """Send one notification; retried with exponential backoff (2**attempts s) while the
    receiver is down or answers 5xx/429. A gone or finished delivery is left alone."""
    outcome = notify.delivery_attempt(delivery_id=delivery_id)
    if outcome.retry_in is not None:
        raise self.retry(countdown=outcome.retry_in)
    return outcome.status


@task(queue="default", time_limit=60, idempotent=True)
def sweep_notifications() -> int:
    """Beat, every minute: deliveries whose task was lost are sent again."""
    return len(notify.deliveries_sweep())
