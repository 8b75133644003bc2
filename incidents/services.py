"""All writes of incidents: breaches open (or join) incidents, status changes, notes, rollback
links and timeline events. Each service owns its transaction; the live pages and the
notification channels hear about a write only once it is committed.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from incidents.models import (
    SEVERITY_RANK,
    STAGES,
    BreachAction,
    BreachGroup,
    BreachKind,
    EventKind,
    Incident,
    IncidentEvent,
    IncidentStatus,
    Severity,
    SlaBreach,
)
from incidents.notifications import delivery as notify
from incidents.notifications.services import (
    notification_channel_create,
    notification_channel_delete,
    notification_channel_update,
)
from incidents.rca.services import cause_rule_create, cause_rule_delete, cause_rule_update
from portal.exceptions import ConflictError, ValidationFailed
from portal.validation import clean_or_fail
from serving.deployments.models import Deployment
from serving.ops.models import Rollback, RollbackStatus
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

logger = logging.getLogger(__name__)

# The configuration services (rules, channels) live in incidents.configuration, exported here.
__all__ = [
    "breach_record",
    "cause_rule_create",
    "cause_rule_delete",
    "cause_rule_update",
    "incident_acknowledge",
    "incident_event_append",
    "incident_link_rollback",
    "incident_mitigate",
    "incident_note",
    "incident_resolve",
    "incident_rollback_finished",
    "incident_rollback_started",
    "notification_channel_create",
    "notification_channel_delete",
    "notification_channel_update",
]


AUTOMATION = Actor(system="incidents")
DEDUP_RETRIES = 3
NOTE_MAX_CHARS = 10_000

# Where each status may go next: forward only, stages may be skipped.
NEXT: dict[str, set[str]] = {
    str(status): {str(later) for later, _ in STAGES[index + 1 :]}
    for index, (status, _) in enumerate(STAGES)
}


def _append(
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


def _escalate(tenant: Tenant, incident: Incident, fields: dict[str, Any], at: datetime) -> None:
    """A page-level breach joining a ticket incident raises it to a page: the timeline says
    why, and the channels that only take pages are told now."""
    if SEVERITY_RANK[fields["severity"]] <= SEVERITY_RANK[incident.severity]:
        return
    before, incident.severity = incident.severity, fields["severity"]
    incident.save(update_fields=["severity"])
    event = _append(
        tenant=tenant,
        incident=incident,
        kind=EventKind.ESCALATED,
        message=f"severity {before} -> {incident.severity}: {fields['objective']} "
        f"({fields['kind']}, {fields['group']})",
        data={"severity": {"from": before, "to": incident.severity}},
        at=at,
    )
    notify.deliveries_create(tenant=tenant, incident=incident, event=event)


def _check_choice(value: str, choices: list[str], field: str) -> None:
    if value not in choices:
        raise ValidationFailed(f"must be one of {', '.join(choices)}.", field=field)


def _dedup_keys(
    deployment: Deployment, group: str, objective: str, is_drill: bool, run: int | None = None
) -> tuple[str, str]:
    """(incident key, breach key). One open incident per deployment slot: a canary failing
    several objectives at once is one incident with several breaches, not several pages."""
    incident_key, breach_key = f"{deployment.pk}:{group}", f"{deployment.pk}:{group}:{objective}"
    # A drill's breach must not fold into (or hide) a real incident of the same slot, nor
    # into another run's incident left open (each run measures its own detection).
    if is_drill:
        prefix = f"drill-{run}" if run is not None else "drill"
        incident_key, breach_key = f"{prefix}:{incident_key}", f"{prefix}:{breach_key}"
    return incident_key[:200], breach_key[:200]


def breach_record(
    *,
    tenant: Tenant,
    deployment: Deployment,
    group: str,
    objective: str,
    kind: str,
    severity: str,
    action: str,
    detail: str,
    observed: dict[str, Any],
    detected_at: datetime,
    contract_version: int | None = None,
    burn_long: float | None = None,
    burn_short: float | None = None,
    is_drill: bool = False,
    drill_run_id: int | None = None,
    join: Incident | None = None,
) -> tuple[SlaBreach, Incident, bool]:
    """Record a breach; returns (breach, incident, opened). One open (triggered or acknowledged)
    incident per deployment slot (deployment, group); once mitigated, a recurrence opens a new
    one. Another objective breaching joins the open incident as a new breach
    (and a timeline event); a repeat of the same objective only bumps that breach's
    `occurrences` and `last_seen_at`. `breach.occurrences == 1` tells a new breach. Safe under
    concurrency (the partial unique constraint decides; the loser retries and joins).
    `join`: the incident this breach belongs to whatever its status (the health tick's other
    breaches of one slot join the incident the tick opened, even once its rollback mitigated
    it)."""
    _check_choice(group, BreachGroup.values, "group")
    _check_choice(kind, BreachKind.values, "kind")
    _check_choice(severity, Severity.values, "severity")
    _check_choice(action, BreachAction.values, "action")
    if deployment.tenant_id != tenant.pk:
        raise ValidationFailed("no such deployment in this tenant.", field="deployment")
    objective = (objective or "").strip()
    if not objective:
        raise ValidationFailed("name the objective or rule.", field="objective")
    key, breach_key = _dedup_keys(
        deployment, group, objective, is_drill or drill_run_id is not None, drill_run_id
    )
    for attempt in range(DEDUP_RETRIES):
        try:
            with transaction.atomic():
                return _breach_record_once(
                    tenant=tenant,
                    deployment=deployment,
                    key=key,
                    breach_key=breach_key,
                    fields={
                        "group": group,
                        "objective": objective[:120],
                        "kind": kind,
                        "severity": severity,
                        "action": action,
                        "detail": detail,
                        "observed": observed or {},
                        "contract_version": contract_version,
                        "burn_long": burn_long,
                        "burn_short": burn_short,
                    },
                    detected_at=detected_at,
                    is_drill=is_drill or drill_run_id is not None,
                    drill_run_id=drill_run_id,
                    join=join,
                )
        except IntegrityError:
            if attempt == DEDUP_RETRIES - 1:
                raise
            logger.info("incident %s opened concurrently; joining it", key)
    raise AssertionError("unreachable")  # pragma: no cover


def _breach_record_once(
    *,
    tenant: Tenant,
    deployment: Deployment,
    key: str,
    breach_key: str,
    fields: dict[str, Any],
    detected_at: datetime,
    is_drill: bool,
    drill_run_id: int | None = None,
    join: Incident | None = None,
) -> tuple[SlaBreach, Incident, bool]:
    if join is not None:
        open_incident = (
            Incident.objects.select_for_update()
            .filter(tenant=tenant, pk=join.pk, dedup_key=key)
            .exclude(status=IncidentStatus.RESOLVED)
            .first()
        )
    else:
        open_incident = (
            Incident.objects.select_for_update()
            .filter(tenant=tenant, dedup_key=key)
            .filter(status__in=[IncidentStatus.TRIGGERED, IncidentStatus.ACKNOWLEDGED])
            .first()
        )
    if open_incident is not None:
        breach = (
            SlaBreach.objects.select_for_update()
            .filter(tenant=tenant, incident=open_incident, dedup_key=breach_key)
            .order_by("id")
            .first()
        )
        if breach is not None:
            breach.occurrences = F("occurrences") + 1
            breach.last_seen_at = max(breach.last_seen_at, detected_at)
            updated = ["occurrences", "last_seen_at"]
            if SEVERITY_RANK[fields["severity"]] > SEVERITY_RANK[breach.severity]:
                # The same objective, worse now (a ticket burn that became a page burn, probe
                # failures piling up): the breach and its incident rise with it.
                breach.severity, breach.detail = fields["severity"], fields["detail"]
                updated += ["severity", "detail"]
                _escalate(tenant, open_incident, fields, detected_at)
            breach.save(update_fields=updated)
            breach.refresh_from_db(fields=["occurrences"])
            return breach, open_incident, False
        # Another objective of the same slot (or an incident opened without a breach): the
        # breach joins the open incident, and its timeline says so.
        breach = SlaBreach(
            tenant=tenant,
            deployment=deployment,
            dedup_key=breach_key,
            detected_at=detected_at,
            last_seen_at=detected_at,
            incident=open_incident,
            **fields,
        )
        clean_or_fail(breach, exclude=["tenant", "deployment", "incident"])
        breach.save()
        _escalate(tenant, open_incident, fields, detected_at)
        _append(
            tenant=tenant,
            incident=open_incident,
            kind=EventKind.BREACH,
            message=f"{fields['objective']} ({fields['kind']}, {fields['group']}): "
            f"{fields['detail']}",
            data={
                "breach": breach.pk,
                "objective": fields["objective"],
                "group": fields["group"],
                "action": fields["action"],
            },  # fmt: skip
            at=detected_at,
        )
        return breach, open_incident, False

    title = f"{deployment.name}: {fields['objective']} breached ({fields['group']})"
    incident = Incident(
        tenant=tenant,
        deployment=deployment,
        title=title[:200],
        severity=fields["severity"],
        triggered_at=detected_at,
        dedup_key=key,
        is_drill=is_drill,
        drill_run_id=drill_run_id,
        summary=fields["detail"],
    )
    # The partial unique constraint is left to the database: under concurrency it raises
    # IntegrityError, which breach_record() turns into a retry that joins the winner.
    clean_or_fail(incident, exclude=["tenant", "deployment"], validate_constraints=False)
    incident.save()
    breach = SlaBreach(
        tenant=tenant,
        deployment=deployment,
        dedup_key=breach_key,
        detected_at=detected_at,
        last_seen_at=detected_at,
        incident=incident,
        **fields,
    )
    clean_or_fail(breach, exclude=["tenant", "deployment", "incident"])
    breach.save()
    incident.first_breach = breach
    incident.save(update_fields=["first_breach"])
    event = _append(
        tenant=tenant,
        incident=incident,
        kind=EventKind.BREACH,
        message=f"{fields['objective']} ({fields['kind']}, {fields['group']}): {fields['detail']}",
        data={
            "breach": breach.pk,
            "objective": fields["objective"],
            "group": fields["group"],
            "observed": fields["observed"],
            "action": fields["action"],
        },
        at=detected_at,
    )
    audit_record(
        tenant=tenant,
        actor=AUTOMATION,
        action="incident.opened",
        obj=incident,
        after={"title": incident.title, "severity": incident.severity, "drill": is_drill},
    )
    notify.deliveries_create(tenant=tenant, incident=incident, event=event)
    return breach, incident, True


def _locked(tenant: Tenant, incident: Incident) -> Incident:
    return Incident.objects.select_for_update().get(pk=incident.pk, tenant=tenant)


def _move(
    *, tenant: Tenant, actor: Actor | None, incident: Incident, to: str, reason: str = ""
) -> Incident:
    """One status change: ordered timestamps, a status_changed event, an audit row, the
    channels told. Moving to the current status again is a no-op (retries are safe)."""
    actor = actor or AUTOMATION
    with transaction.atomic():
        locked = _locked(tenant, incident)
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
        event = _append(
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
        locked = _locked(tenant, incident)
        return _append(
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
        locked = _locked(tenant, incident)
        return _append(
            tenant=tenant, incident=locked, kind=kind, message=message, data=data, actor=actor
        )


def incident_link_rollback(*, tenant: Tenant, incident: Incident, rollback: Rollback) -> Incident:
    """Record the rollback that answers this incident (idempotent)."""
    if rollback.tenant_id != tenant.pk:
        raise ValidationFailed("no such rollback in this tenant.", field="rollback")
    with transaction.atomic():
        locked = _locked(tenant, incident)
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
        current = _locked(tenant, incident)
        if (
            rollback.status == RollbackStatus.DONE
            and IncidentStatus.MITIGATED in NEXT[current.status]
        ):
            incident_mitigate(
                tenant=tenant, actor=None, incident=current, reason=f"rollback {rollback.key} done"
            )
