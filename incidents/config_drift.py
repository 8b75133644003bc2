"""incidents' side of config drift (serving.deployments.drift): a deployment whose Serve config
drifted from the portal's is a breach of the `config-drift-<grade>` objective on the whole
deployment, with the grade and the differing fields on the timeline. P0 and P1 page (the portal
re-applies its config as well); P2 is a ticket: recorded, not paged."""

from __future__ import annotations

from incidents import services as incidents
from serving.control.drift import P2
from serving.deployments.drift import DriftFinding

MAX_DETAIL_FIELDS = 10


def record_drift(finding: DriftFinding) -> None:
    deployment = finding.deployment
    if deployment is None:  # a platform unit (a shared pool, the GPU samplers): no tenant's
        return
    fields = finding.fields
    shown = ", ".join(fields[:MAX_DETAIL_FIELDS]) + (
        " ..." if len(fields) > MAX_DETAIL_FIELDS else ""
    )
    incidents.breach_record(
        tenant=deployment.tenant,
        deployment=deployment,
        group="all",
        objective=f"config-drift-{finding.grade}",
        kind="drift",
        severity="ticket" if finding.grade == P2 else "page",
        action="notify",
        detail=f"{finding.grade} config drift: Serve runs another config than the portal "
        f"applied ({shown}); {finding.action}",
        observed={
            "grade": finding.grade,
            "fields": fields,
            "action": finding.action,
            "apps": [a.as_json() for a in finding.apps],
        },
        detected_at=finding.detected_at,
    )
