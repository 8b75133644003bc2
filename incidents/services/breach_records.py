"""Breach recording: a breach opens an incident, joins the open one of its deployment slot
(deduplicated, safe under concurrency), or only counts again; a worse breach escalates its
incident. Each service owns its transaction; the channels hear about it once committed.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from incidents.models import (
    SEVERITY_RANK,
    BreachAction,
    BreachGroup,
    BreachKind,
    EventKind,
    Incident,
    IncidentStatus,
    Severity,
    SlaBreach,
)
from incidents.notifications import delivery as notify
from incidents.services.incidents import AUTOMATION, timeline_append
from portal.exceptions import ValidationFailed
from portal.statelog import state_changed
from portal.validation import clean_or_fail
from serving.deployments.models import Deployment
from tenants.models import Tenant
from tenants.services import audit_record

logger = logging.getLogger(__name__)

DEDUP_RETRIES = 3


def _escalate(tenant: Tenant, incident: Incident, fields: dict[str, Any], at: datetime) -> None:
    """A page-level breach joining a ticket incident raises it to a page: the timeline says
    why, and the channels that only take pages are told now."""
    if SEVERITY_RANK[fields["severity"]] <= SEVERITY_RANK[incident.severity]:
        return
    before, incident.severity = incident.severity, fields["severity"]
    incident.save(update_fields=["severity"])
    event = timeline_append(
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


def breach_record_if_new(
    *, tenant: Tenant, deployment: Deployment, objective: str, kind: str, **fields: Any
) -> bool:
    """`breach_record` unless the deployment ever had a breach of this objective and kind (an
    alerted one is found again whatever its incident's state); True when recorded now. The
    check and the record run under the deployment's row lock: ticks running side by side (and
    a tick beside a manual one) see the same event, and one records it."""
    with transaction.atomic():
        Deployment.objects.select_for_update().filter(pk=deployment.pk).values("pk").first()
        if SlaBreach.objects.filter(
            tenant_id=tenant.pk, deployment=deployment, kind=kind, objective=objective
        ).exists():
            return False
        breach_record(
            tenant=tenant, deployment=deployment, objective=objective, kind=kind, **fields
        )
    return True


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
        timeline_append(
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
            },
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
    state_changed(
        "incident %s opened (%s, %s): %s", incident.pk, tenant.slug, incident.severity, title
    )
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
    event = timeline_append(
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
