"""incidents' side of remediation (serving.ops.remediation): a new breach starts the chains its
alert triggers, for its incident; each step the run takes lands on that incident's timeline,
and a rollback a step started is linked to the incident (mitigated when it finishes)."""

from __future__ import annotations

from typing import Any

from incidents import services as incidents
from incidents.models import EventKind, Incident
from serving.ops.events import SlotAlerts
from serving.ops.models import Rollback
from serving.ops.remediation.models import RemediationRun, RemediationStep
from serving.ops.remediation.services import remediation_start


def start_for_alert(event: SlotAlerts, alert: Any, incident: Incident) -> list[int]:
    """The runs a new breach starts (none when the contract has no chain for its alert)."""
    return remediation_start(
        tenant=event.deployment.tenant,
        deployment=event.deployment,
        group=event.group,
        alert_kind=alert.kind,
        alert_name=alert.name,
        alert_action=alert.action,
        incident_id=incident.pk,
        contract_version=event.contract_version,
    )


def remediation_progressed(
    *, run: RemediationRun, step: RemediationStep | None, message: str
) -> None:
    if run.incident_id is None:
        return
    incident = Incident.objects.filter(tenant_id=run.tenant_id, pk=run.incident_id).first()
    if incident is None:
        return
    data: dict[str, Any] = {"run": run.pk, "chain": run.chain, "run_status": run.status}
    if step is not None:
        data.update(
            step=step.index, action=step.kind, status=step.status, outcome=_small(step.data)
        )
    incidents.incident_event_append(
        tenant=incident.tenant,
        incident=incident,
        kind=EventKind.REMEDIATION,
        message=message,
        data=data,
    )
    rollback_id = (step.data or {}).get("rollback") if step is not None else None
    if rollback_id and incident.rollback_id is None:
        rollback = Rollback.objects.filter(tenant_id=run.tenant_id, pk=rollback_id).first()
        if rollback is not None:
            incidents.incident_link_rollback(
                tenant=incident.tenant, incident=incident, rollback=rollback
            )


def _small(data: Any) -> dict[str, Any]:
    """What a timeline entry keeps of a step's outcome (a restart's replica ids, a revision)."""
    if not isinstance(data, dict):
        return {}
    keep = ("revision", "from", "to", "rollback", "tier", "version", "restarted", "error")
    return {k: data[k] for k in keep if k in data}
