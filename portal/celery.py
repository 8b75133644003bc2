"""The Celery app and the one task decorator that sets the portal's task defaults."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from celery import Celery
from kombu import Exchange, Queue  # type: ignore[attr-defined]

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

# default: reconcile and its follow-ups, notifications, tenants' mail; health: the health tick
# and status refresh (never behind anything else); chaos: drill steps; validation: model
# validations (minutes each); checks: a version's verify/benchmark (a tenant's, never ahead of
# or behind another's validation). `manage.py up` gives health, validation and checks workers.
QUEUES = ("default", "health", "chaos", "validation", "checks")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [
    Queue(name, Exchange(name), routing_key=name)  # type: ignore[no-untyped-call]
    for name in QUEUES
]
# Each room keeps its tasks beside its services; Celery imports every room's `tasks` module.
TASK_PACKAGES = (
    "portal",
    "tenants",
    "serving.registry",
    "serving.deployments",
    "serving.ops",
    "serving.ops.checks",
    "serving.ops.remediation",
    "serving.telemetry",
    "incidents.notifications",
    "incidents.drills",
)
app.autodiscover_tasks(list(TASK_PACKAGES))


def task(
    *,
    name: str,
    queue: str,
    time_limit: int = 60,
    soft_time_limit: int | None = None,
    idempotent: bool = False,
    **options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Declare a Celery task with the portal's defaults.

    Every task has an explicit, stable name (`<app>.<verb>`, never derived from its file, so
    moving a module does not orphan queued messages, beat entries or stored drill schedules),
    and names its queue and time limits; idempotent tasks are acknowledged late and
    re-queued if the worker dies, so a killed worker never loses their work.
    """
    app_label, _, verb = name.partition(".")
    if app_label not in ("portal", "tenants", "serving", "incidents") or not verb.isidentifier():
        raise ValueError(f"task name {name!r} must read '<app>.<verb>'")
    if queue not in QUEUES:
        raise ValueError(f"unknown queue {queue!r}; declare it in portal.celery.QUEUES")

    def decorator(func: Callable[..., Any]) -> Any:
        return app.task(
            name=name,
            queue=queue,
            time_limit=time_limit,
            soft_time_limit=soft_time_limit or max(1, time_limit - 5),
            acks_late=idempotent,
            reject_on_worker_lost=idempotent,
            **options,
        )(func)

    return decorator
