"""The conditions of a wait step, judged from what the health tick last found for the slot:
`still_breaching` (the alert that started the run still fires), `recovered` (it does not),
`always`. Unknown (None) until a tick has evaluated the slot after the wait ended, so a wait
is never judged on counters older than itself."""

from __future__ import annotations

from datetime import datetime

from serving.ops.health.state import deployment_health
from serving.ops.remediation.models import RemediationRun


def breaching(run: RemediationRun, *, since: datetime) -> bool | None:
    health = deployment_health(run.deployment_id)
    if float(health.get("checked_at") or 0) < since.timestamp():
        return None
    slot = (health.get("slots") or {}).get(run.group) or {}
    return any(f.get("name") == run.alert for f in slot.get("firing") or [])


def holds(run: RemediationRun, condition: str, *, since: datetime) -> bool | None:
    if condition == "always":
        return True
    found = breaching(run, since=since)
    if found is None:
        return None
    return found if condition == "still_breaching" else not found
