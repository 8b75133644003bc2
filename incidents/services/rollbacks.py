"""The incident side of rollbacks: the rollback that answers an incident is linked to it,
its start and finish go on the timeline, and a rollback that is done mitigates the incident.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from incidents.models import EventKind, Incident, IncidentStatus
from incidents.services.incidents import (
    NEXT,
    incident_event_append,
    incident_locked,
    incident_mitigate,
)
from portal.exceptions import ValidationFailed
from serving.ops.models import Rollback, RollbackStatus
from tenants.models import Tenant


def incident_link_rollback(*, tenant: Tenant, incident: Incident, rollback: Rollback) -> Incident:
    """Record the rollback that answers this incident (idempotent)."""
    if rollback.tenant_id != tenant.pk:
        raise ValidationFailed("no such rollback in this tenant.", field="rollback")
    with transaction.atomic():
        locked = incident_locked(tenant=tenant, incident=incident)
        if locked.rollback_id != rollback.pk:
            locked.rollback = rollback
            locked.save(update_fields=["rollback"])
    incident.rollback = rollback
    return locked


def _rollback_data(rollback: Rollback) -> dict[str, Any]:
    def seconds(a: datetime | None, b: datetime | None) -> float | None:
        return None if a is None or b is None else round((b - a).total_seconds(), 3)

    return {
        "rollback": rollback.pk,
        "status": rollback.status,
        "from_revision": rollback.from_revision_id,
        "to_revision": rollback.to_revision_id,
        "new_revision": rollback.new_revision_id,
        "detect_to_start_s": seconds(rollback.detected_at, rollback.started_at),
        "start_to_switch_s": seconds(rollback.started_at, rollback.traffic_switched_at),
        "detect_to_finish_s": seconds(rollback.detected_at, rollback.finished_at),
    }


def incident_rollback_started(*, tenant: Tenant, incident: Incident, rollback: Rollback) -> None:
    """Link the rollback and put `rollback_started` on the timeline (for the rollback code)."""
    with transaction.atomic():
        incident_link_rollback(tenant=tenant, incident=incident, rollback=rollback)
        incident_event_append(
            tenant=tenant,
            incident=incident,
            kind=EventKind.ROLLBACK_STARTED,
            message=f"rollback {rollback.key} started: {rollback.reason}".strip(": "),
            data=_rollback_data(rollback),
        )


def incident_rollback_finished(*, tenant: Tenant, incident: Incident, rollback: Rollback) -> None:
    """`rollback_finished` on the timeline; a rollback that is done mitigates the incident."""
    with transaction.atomic():
        incident_link_rollback(tenant=tenant, incident=incident, rollback=rollback)
        incident_event_append(
            tenant=tenant,
            incident=incident,
            kind=EventKind.ROLLBACK_FINISHED,
            message=f"rollback {rollback.key} {rollback.status}"
            + (f": {rollback.error}" if rollback.error else ""),
            data=_rollback_data(rollback),
        )
        current = incident_locked(tenant=tenant, incident=incident)
        if (
            rollback.status == RollbackStatus.DONE
            and IncidentStatus.MITIGATED in NEXT[current.status]
        ):
            incident_mitigate(
                tenant=tenant, actor=None, incident=current, reason=f"rollback {rollback.key} done"
            )
