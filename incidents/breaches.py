"""What incidents does with the ops loop's events (serving.ops.events): a firing alert is
recorded as a breach (one incident per breach, deduplicated), then the contract's action runs:
roll back, pause the rollout, or notify. A failed rollout's breach and incident are recorded
here too (the rollout rolled itself back already)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from incidents import remediation
from incidents import services as incidents
from incidents.drills.selectors import active_run_id
from portal.exceptions import ConflictError
from serving.ops.events import SlotAlerts
from serving.ops.models import Rollback, Rollout
from serving.ops.rollbacks import rollback_request, rollback_run_now
from serving.ops.rollouts import rollout_pause_for_breach

logger = logging.getLogger(__name__)
SEVERITY_ORDER = {"page": 0, "ticket": 1}
ACTION_ORDER = {"rollback": 0, "pause": 1, "notify": 2}


def handle_firing(event: SlotAlerts) -> list[dict[str, Any]]:
    """Record each firing alert of one slot and act on the new ones, most severe first."""
    deployment, group, detected_at = event.deployment, event.group, event.detected_at
    tenant = deployment.tenant
    to_run: list[int] = []
    has_canary = event.revision.canary_version_id is not None
    actions: list[dict[str, Any]] = []
    rolled_back = False
    ordered = sorted(
        event.alerts,
        key=lambda a: (SEVERITY_ORDER.get(a.severity, 9), ACTION_ORDER.get(a.action, 9)),
    )
    this_tick: Any = None  # the slot's incident of this tick: the other breaches join it
    drill_run = active_run_id(deployment.pk)  # a drill's fault is in: its breaches are drills
    for alert in ordered:
        with transaction.atomic():
            breach, incident, _ = incidents.breach_record(
                tenant=tenant,
                deployment=deployment,
                group=group,
                objective=alert.name,
                kind=alert.kind,
                severity=alert.severity,
                action=alert.action,
                detail=alert.detail,
                observed={"value": alert.value, "revision": event.revision.number},
                detected_at=detected_at,
                contract_version=event.contract_version,
                burn_long=alert.burn_long,
                burn_short=alert.burn_short,
                drill_run_id=drill_run,
                join=this_tick,
            )
            this_tick = incident
            if breach.occurrences > 1:
                continue  # a repeat: the first occurrence already acted
            record: dict[str, Any] = {
                "deployment": deployment.pk,
                "group": group,
                "objective": alert.name,
                "action": alert.action,
                "incident": incident.pk,
            }
            if alert.action == "rollback" and not rolled_back and incident.rollback_id is None:
                if group == "stable" and has_canary:
                    incidents.incident_event_append(
                        tenant=tenant,
                        incident=incident,
                        kind="note",
                        message="the stable slot is breaching: rolling back the canary would "
                        "not change its version, so no rollback was started",
                    )
                else:
                    try:
                        rollback, created = rollback_request(
                            tenant=tenant,
                            deployment=deployment,
                            trigger="breach",
                            reason=alert.detail,
                            detected_at=detected_at,
                            enqueue=False,
                        )
                        if created:
                            to_run.append(rollback.pk)
                    except ConflictError as exc:
                        incidents.incident_event_append(
                            tenant=tenant,
                            incident=incident,
                            kind="note",
                            message=f"no rollback: {exc.message}",
                        )
                    else:
                        incidents.incident_link_rollback(
                            tenant=tenant, incident=incident, rollback=rollback
                        )
                        rolled_back = True
                        record["rollback"] = rollback.pk
            elif alert.action == "pause":
                record["paused"] = rollout_pause_for_breach(
                    tenant=tenant, deployment=deployment, reason=alert.detail
                )
            # The contract's remediation chains for this alert (and an alert's own
            # scale_out, restart_replicas, shed_load or switch_to_fallback), once per incident.
            runs = remediation.start_for_alert(event, alert, incident)
            if runs:
                record["remediation"] = runs
            actions.append(record)
        # Committed: switch traffic now, in this process, before the other alerts' paperwork
        # (they join this incident even once the rollback has mitigated it).
        while to_run:
            rollback_run_now(to_run.pop())
    return actions


def rollout_failed(
    *,
    rollout: Rollout,
    rollback: Rollback | None,
    summary: str,
    detected_at: datetime,
    contract_version: int | None,
) -> dict[str, Any]:
    """A rollout's analysis failed beyond its limit and the rollout rolled back to the revision
    the canary started from (or paused, `on_failure: pause`): its breach and incident."""
    deployment = rollout.deployment
    action = "pause" if rollback is None else "rollback"
    _, incident, _ = incidents.breach_record(
        tenant=deployment.tenant,
        deployment=deployment,
        group="canary",
        objective="canary-analysis",
        kind="analysis",
        severity="page",
        action=action,
        detail=f"canary analysis failed: {summary}",
        observed={"rollout": rollout.pk},
        detected_at=detected_at,
        contract_version=contract_version,
    )
    if rollback is None:
        return {"incident": incident.pk}
    incidents.incident_link_rollback(tenant=deployment.tenant, incident=incident, rollback=rollback)
    return {"incident": incident.pk}
