"""incidents' side of the ops events port (serving.ops.events): the one OpsListener.

Receivers run inside the emitter's transaction and write only incidents' rows; broadcasts and
webhooks are deferred to commit by the services they call."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from incidents import breaches, remediation
from incidents import services as incidents
from incidents.kv_integrity import record_kv_violation
from incidents.models import Incident
from incidents.reload_failures import record_reload_failure
from serving.ops.events import KvIntegrityViolated, ReloadFailed, SlotAlerts, Stage
from serving.ops.models import Rollback, Rollout
from serving.ops.remediation.models import RemediationRun, RemediationStep

# What the timeline says when a rollback switches traffic, and when it is done.
_MESSAGES = {
    "started": ("rollback_started", "rollback to revision {to} started ({trigger})"),
    "finished": ("rollback_finished", "traffic is back on revision {to}'s version"),
}


class IncidentsListener:
    def alerts_fired(self, event: SlotAlerts) -> list[dict[str, Any]]:
        return breaches.handle_firing(event)

    def rollout_failed(
        self,
        *,
        rollout: Rollout,
        rollback: Rollback | None,
        summary: str,
        detected_at: datetime,
        contract_version: int | None,
    ) -> dict[str, Any]:
        return breaches.rollout_failed(
            rollout=rollout,
            rollback=rollback,
            summary=summary,
            detected_at=detected_at,
            contract_version=contract_version,
        )

    def rollback_progressed(self, *, rollback: Rollback, stage: Stage) -> None:
        """The incidents linked to this rollback hear of it; once it is done, they are
        mitigated (still triggered or acknowledged ones)."""
        kind, template = _MESSAGES[stage]
        message = template.format(to=rollback.to_revision.number, trigger=rollback.trigger)
        for incident in Incident.objects.filter(tenant=rollback.tenant, rollback=rollback):
            incidents.incident_event_append(
                tenant=rollback.tenant,
                incident=incident,
                kind=kind,
                message=message,
                data={"rollback": rollback.pk},
            )
            if stage == "finished" and incident.status in ("triggered", "acknowledged"):
                incidents.incident_mitigate(tenant=rollback.tenant, actor=None, incident=incident)

    def remediation_progressed(
        self, *, run: RemediationRun, step: RemediationStep | None, message: str
    ) -> None:
        """Each step of a remediation run on its incident's timeline; a rollback it started
        is linked to the incident (so the incident is mitigated when it finishes)."""
        remediation.remediation_progressed(run=run, step=step, message=message)

    def reload_failed(self, event: ReloadFailed) -> bool:
        """A failed hot reload: a ticket on its slot's incident, once per failure."""
        return record_reload_failure(event)

    def kv_integrity_violated(self, event: KvIntegrityViolated) -> bool:
        """A replica's KV pool broke an invariant: a page on its slot's incident, once."""
        return record_kv_violation(event)
