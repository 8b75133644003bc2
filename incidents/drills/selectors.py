"""Reads of drill runs: the run whose fault is in a deployment now (its breaches are drills)
and the active runs whose step task died with a worker (to resume)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from incidents.drills.base import RESUME_AFTER_S
from incidents.drills.models import ACTIVE_STATUSES, DrillRun, DrillStatus


def active_run_id(deployment_id: int) -> int | None:
    """The run whose fault is (or may be) in the deployment now: its breaches are drills."""
    return (
        DrillRun.objects.filter(
            deployment_id=deployment_id,
            status__in=[DrillStatus.INJECTING, DrillStatus.OBSERVING, DrillStatus.REVERTING],
        )
        .values_list("pk", flat=True)
        .first()
    )


def runs_to_resume(now: datetime | None = None) -> list[int]:
    """Active runs nobody stepped for RESUME_AFTER_S: their task died with a worker."""
    from django.conf import settings

    now = now or timezone.now()
    after = float(getattr(settings, "DRILL_RESUME_AFTER_S", RESUME_AFTER_S))
    return list(
        DrillRun.objects.filter(
            status__in=ACTIVE_STATUSES, stepped_at__lt=now - timedelta(seconds=after)
        ).values_list("pk", flat=True)
    )
