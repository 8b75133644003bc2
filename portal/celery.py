"""The Celery app and the one task decorator that sets the portal's task defaults."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from celery import Celery
from kombu import Exchange, Queue  # type: ignore[attr-defined]

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

QUEUES = ("default", "health", "chaos")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [
    Queue(name, Exchange(name), routing_key=name)  # type: ignore[no-untyped-call]
    for name in QUEUES
]
app.autodiscover_tasks()


def task(
    *,
    queue: str,
    time_limit: int = 60,
    soft_time_limit: int | None = None,
    idempotent: bool = False,
    **options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Declare a Celery task with the portal's defaults.

    Every task names its queue and time limits; idempotent tasks are acknowledged late and
    re-queued if the worker dies, so a killed worker never loses their work.
    """
    if queue not in QUEUES:
        raise ValueError(f"unknown queue {queue!r}; declare it in portal.celery.QUEUES")

    def decorator(func: Callable[..., Any]) -> Any:
        return app.task(
            queue=queue,
            time_limit=time_limit,
            soft_time_limit=soft_time_limit or max(1, time_limit - 5),
            acks_late=idempotent,
            reject_on_worker_lost=idempotent,
            **options,
        )(func)

    return decorator
