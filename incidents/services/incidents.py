"""Incident status moves (acknowledge, mitigate, resolve: forward only), notes and timeline
events. Each service owns its transaction; the live pages and the notification channels hear
about a write only once it is committed. The timeline and lock helpers here are shared with the
breach and rollback services of this package.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from incidents.models import STAGES, EventKind, Incident, IncidentEvent, IncidentStatus
from incidents.notifications import delivery as notify
from portal.exceptions import ConflictError, ValidationFailed
from portal.statelog import state_changed
from portal.validation import clean_or_fail
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

AUTOMATION = Actor(system="incidents")
NOTE_MAX_CHARS = 10_000

# Where each status may go next: forward only, stages may be skipped.
NEXT: dict[str, set[str]] = {
    str(status): {str(later) for later, _ in STAGES[index + 1 :]}
    for index, (status, _) in enumerate(STAGES)
}


def timeline_append(
    *,
    tenant: Tenant,
    incident: Incident,
    kind: str,
    message: str,
    data: dict[str, Any] | None = None,
    actor: Actor | None = None,
    at: datetime | None = None,
) -> IncidentEvent:
    """One timeline event, inside the caller's transaction; broadcast on commit."""
    if kind not in EventKind.values:
        raise ValidationFailed(f"must be one of {', '.join(EventKind.values)}.", field="kind")
    actor = actor or AUTOMATION
    event = IncidentEvent(
        tenant=tenant,
        incident=incident,
        kind=kind,
        at=at or timezone.now(),
        actor_id=actor.user_id,
        actor_label=actor.label[:200],
        message=message,
        data=data or {},
    )
    clean_or_fail(event, exclude=["incident", "tenant", "actor"])
    event.save()
    notify.broadcast_on_commit(incident, kind)
    return event


def incident_locked(*, tenant: Tenant, incident: Incident) -> Incident:
    """The incident's row, locked for the caller's transaction."""
    return Incident.objects.select_for_update().get(pk=incident.pk, tenant=tenant)


def _move(
    *, tenant: Tenant, actor: Actor | None, incident: Incident, to: str, reason: str = ""
) -> Incident:
    """One status change: ordered timestamps, a status_changed event, an audit row, the
    channels told. Moving to the current status again is a no-op (retries are safe)."""
    actor = actor or AUTOMATION
    with transaction.atomic():
        locked = incident_locked(tenant=tenant, incident=incident)
        before = locked.status
        if before == to:
            return locked
        if to not in NEXT[before]:
            raise ConflictError(f"an incident that is {before} cannot become {to}.", field="status")
        stamps = [getattr(locked, f) for _, f in STAGES if getattr(locked, f) is not None]
        at = max([timezone.now(), *stamps])  # a clock behind the detector's never reorders
        field = dict(STAGES)[IncidentStatus(to)]
        setattr(locked, field, at)
        locked.status = to
        clean_or_fail(locked, exclude=["tenant", "deployment", "rollback", "first_breach"])
        locked.save(update_fields=["status", field])
        message = f"{before} -> {to}" + (f": {reason}" if reason else "")
        event = timeline_append(
            tenant=tenant,
            incident=locked,
            kind=EventKind.STATUS_CHANGED,
            message=message,
            data={"from": before, "to": to},
            actor=actor,
            at=at,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action=f"incident.{to}",
            obj=locked,
            before={"status": before},
            after={"status": to},
        )
        notify.deliveries_create(tenant=tenant, incident=locked, event=event)
        state_changed("incident %s (%s): %s", locked.pk, tenant.slug, message)
    incident.status = locked.status
    setattr(incident, field, at)
    return locked


def incident_acknowledge(*, tenant: Tenant, actor: Actor, incident: Incident) -> Incident:
    return _move(tenant=tenant, actor=actor, incident=incident, to=IncidentStatus.ACKNOWLEDGED)


def incident_mitigate(
    *, tenant: Tenant, actor: Actor | None, incident: Incident, reason: str = ""
) -> Incident:
    """Mitigated by a human or (actor None) by the automation, e.g. a finished rollback."""
    return _move(
        tenant=tenant, actor=actor, incident=incident, to=IncidentStatus.MITIGATED, reason=reason
    )


def incident_resolve(
    *, tenant: Tenant, actor: Actor | None, incident: Incident, reason: str = ""
) -> Incident:
    return _move(
        tenant=tenant, actor=actor, incident=incident, to=IncidentStatus.RESOLVED, reason=reason
    )


def incident_note(*, tenant: Tenant, actor: Actor, incident: Incident, text: str) -> IncidentEvent:
    text = (text or "").strip()
    if not text:
        raise ValidationFailed("write something.", field="text")
    if len(text) > NOTE_MAX_CHARS:
        raise ValidationFailed(f"keep a note under {NOTE_MAX_CHARS} characters.", field="text")
    with transaction.atomic():
        locked = incident_locked(tenant=tenant, incident=incident)
        return timeline_append(
            tenant=tenant, incident=locked, kind=EventKind.NOTE, message=text, actor=actor
        )


def incident_event_append(
    *,
    tenant: Tenant,
    incident: Incident,
    kind: str,
    message: str,
    data: dict[str, Any] | None = None,
    actor: Actor | None = None,
) -> IncidentEvent:
    """Append one event to the timeline (automation: analysis, hints, rollback steps)."""
    with transaction.atomic():
        locked = incident_locked(tenant=tenant, incident=incident)
        return timeline_append(
            tenant=tenant, incident=locked, kind=kind, message=message, data=data, actor=actor
        )
