"""What the health tick does with a firing alert: record the breach (one incident per breach,
deduplicated), then the contract's action: roll back, pause the rollout, or notify."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.db import transaction

from portal.exceptions import ConflictError
from serving.ops_models import Rollout, RolloutStatus
from serving.sli_store import as_datetime

if TYPE_CHECKING:
    from serving.health import Target

logger = logging.getLogger(__name__)
SEVERITY_ORDER = {"page": 0, "ticket": 1}
ACTION_ORDER = {"rollback": 0, "pause": 1, "notify": 2}


def handle_firing(
    target: Target, group: str, alerts: list[Any], now: float
) -> list[dict[str, Any]]:
    from incidents import services as incidents
    from serving.rollbacks import rollback_request, rollback_run_now

    deployment = target.deployment
    tenant = deployment.tenant
    to_run: list[int] = []
    has_canary = target.revision.canary_version_id is not None
    actions: list[dict[str, Any]] = []
    rolled_back = False
    ordered = sorted(
        alerts, key=lambda a: (SEVERITY_ORDER.get(a.severity, 9), ACTION_ORDER.get(a.action, 9))
    )
    this_tick: Any = None  # the slot's incident of this tick: the other breaches join it
    from incidents.drills import active_run_id

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
                observed={"value": alert.value, "revision": target.revision.number},
                detected_at=as_datetime(now),
                contract_version=target.contract_version,
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
                        tenant=tenant, incident=incident, kind="note",
                        message="the stable slot is breaching: rolling back the canary would "
                        "not change its version, so no rollback was started",
                    )  # fmt: skip
                else:
                    try:
                        rollback, created = rollback_request(
                            tenant=tenant, deployment=deployment, trigger="breach",
                            reason=alert.detail, detected_at=as_datetime(now), enqueue=False,
                        )  # fmt: skip
                        if created:
                            to_run.append(rollback.pk)
                    except ConflictError as exc:
                        incidents.incident_event_append(
                            tenant=tenant, incident=incident, kind="note",
                            message=f"no rollback: {exc.message}",
                        )  # fmt: skip
                    else:
                        incidents.incident_link_rollback(
                            tenant=tenant, incident=incident, rollback=rollback
                        )
                        rolled_back = True
                        record["rollback"] = rollback.pk
            elif alert.action == "pause":
                paused = Rollout.objects.filter(
                    tenant=tenant, deployment=deployment, status=RolloutStatus.PROGRESSING
                ).update(status=RolloutStatus.PAUSED, message=f"paused by breach: {alert.detail}")
                record["paused"] = bool(paused)
            actions.append(record)
        # Committed: switch traffic now, in this process, before the other alerts' paperwork
        # (they join this incident even once the rollback has mitigated it).
        while to_run:
            rollback_run_now(to_run.pop())
    return actions


def rollout_failed(rollout: Rollout, target: Target, summary: str, now: float) -> dict[str, Any]:
    """A rollout's analysis failed beyond its limit: an incident, then a rollback to the
    revision the canary started from (or a pause, `on_failure: pause`)."""
    from incidents import services as incidents
    from serving.rollbacks import rollback_request, rollback_run_now

    deployment = target.deployment
    on_failure = rollout.policy.get("on_failure", "abort")
    action = "pause" if on_failure == "pause" else "rollback"
    _, incident, _ = incidents.breach_record(
        tenant=deployment.tenant, deployment=deployment, group="canary",
        objective="canary-analysis", kind="analysis", severity="page", action=action,
        detail=f"canary analysis failed: {summary}", observed={"rollout": rollout.pk},
        detected_at=as_datetime(now), contract_version=target.contract_version,
    )  # fmt: skip
    if action == "pause":
        rollout.status, rollout.message = RolloutStatus.PAUSED, f"failed, paused: {summary}"
        rollout.save(update_fields=["status", "message"])
        return {"paused": True, "incident": incident.pk}
    rollback, created = rollback_request(
        tenant=deployment.tenant, deployment=deployment, trigger="analysis",
        reason=f"canary analysis failed: {summary}", detected_at=as_datetime(now),
        rollout=rollout, enqueue=False,
    )  # fmt: skip
    if created:  # after the analysis' transaction commits: switch traffic in this process
        transaction.on_commit(lambda: rollback_run_now(rollback.pk))
    incidents.incident_link_rollback(tenant=deployment.tenant, incident=incident, rollback=rollback)
    return {"rollback": rollback.pk, "incident": incident.pk}
