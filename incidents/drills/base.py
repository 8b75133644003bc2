"""What every part of the drill engine shares: its timings, the run's timeline, its actor."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from incidents.drills.models import DrillEvent, DrillRun
from tenants.actors import Actor

logger = logging.getLogger("incidents.drills")

TTL_GRACE_S = 60  # the fault outlives the planned duration by this much at most
STEP_S = 1.0  # how often an observing run looks
RECOVERY_WAIT_S = 60  # after the revert, how long the steady state has to come back
# After the revert, how long a fault that took effect may still be noticed (a stored SLI row
# or a replica report comes late, e.g. after a worker restart) before the run says undetected.
DETECTION_WAIT_S = 20
PROBE_WINDOW_S = 15  # probes judge the last this-many seconds of stored SLI rows
CATCH_UP_MAX_S = 300  # and the rows since the previous step, this far back at most
# An active run not stepped for this long lost its task (DRILL_RESUME_AFTER_S, tests shorten it).
RESUME_AFTER_S = 15


def record_event(run: DrillRun, kind: str, message: str, **data: Any) -> DrillEvent:
    return DrillEvent.objects.create(
        tenant_id=run.tenant_id, run=run, kind=kind, message=message, data=data
    )


def to_datetime(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def run_actor(run: DrillRun) -> Actor:
    return Actor(system=f"drill run {run.pk}")
