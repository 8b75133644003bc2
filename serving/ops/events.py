"""What the ops loop tells the rest of the portal: the port to incidents.

serving never imports incidents: incidents subscribes here when it starts
(`IncidentsConfig.ready`), with one listener that implements `OpsListener`.

Transaction rule: events are synchronous, inside the emitter's transaction (a rollback's
`finished` fires inside the `atomic()` that marks it done, so the incident's mitigation commits
with it). Listeners write only their own app's rows and defer outside effects (broadcasts,
webhooks) with `transaction.on_commit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from serving.deployments.models import Deployment, DeploymentRevision
    from serving.ops.models import Rollback, Rollout
    from serving.ops.remediation.models import RemediationRun, RemediationStep

Group = Literal["stable", "canary"]
Stage = Literal["started", "finished"]


@dataclass(frozen=True)
class SlotAlerts:
    """One slot's firing alerts in one health tick (the alerts are `serving.slo` Firing)."""

    deployment: Deployment
    revision: DeploymentRevision
    contract_version: int | None
    group: Group
    alerts: Sequence[Any]
    detected_at: datetime


@dataclass(frozen=True)
class ReloadFailed:
    """One failed hot reload of a replica (an error or an overrun deadline; the old weights
    kept serving), told once (serving.ops.health.reloads). `slot`: stable, canary or a tier."""

    deployment: Deployment
    slot: str
    replica: str
    failure: dict[str, Any]  # artifact, version, error, at (serving.dataplane.standby)
    detected_at: datetime

    @property
    def key(self) -> str:
        """The failure's identity, the same at every tick that sees it."""
        return f"reload-failed:{self.slot}:{self.replica[:40]}:{float(self.failure['at']):.3f}"


@dataclass(frozen=True)
class KvIntegrityViolated:
    """A replica's KV block pool broke an invariant (serving.ops.health.kv_integrity): told
    once per replica, whatever the number of ticks that see it."""

    deployment: Deployment
    slot: str
    replica: str
    report: dict[str, Any]  # the violating scan: counts by invariant, samples
    detected_at: datetime

    @property
    def key(self) -> str:
        return f"kv-integrity:{self.slot}:{self.replica[:40]}"


class OpsListener(Protocol):
    def alerts_fired(self, event: SlotAlerts) -> list[dict[str, Any]]:
        """Record the breaches and act on them (the contract's rollback, pause or notify);
        returns what was done, one record per alert acted on."""
        ...

    def rollout_failed(
        self,
        *,
        rollout: Rollout,
        rollback: Rollback | None,
        summary: str,
        detected_at: datetime,
        contract_version: int | None,
    ) -> dict[str, Any]:
        """A rollout failed its analysis and was rolled back (or paused: rollback None)."""
        ...

    def rollback_progressed(self, *, rollback: Rollback, stage: Stage) -> None:
        """A rollback started switching traffic, or finished."""
        ...

    def remediation_progressed(
        self, *, run: RemediationRun, step: RemediationStep | None, message: str
    ) -> None:
        """A remediation run started, ran a step (`step`), or ended (step None)."""
        ...

    def reload_failed(self, event: ReloadFailed) -> bool:
        """Alert on a failed reload unless told of it before; True when alerted now."""
        ...

    def kv_integrity_violated(self, event: KvIntegrityViolated) -> bool:
        """Alert on a replica's broken KV pool unless told before; True when alerted now."""
        ...


_listeners: list[OpsListener] = []


def subscribe(listener: OpsListener) -> None:
    """Add a listener (once per kind: a second `ready()` does not double every event)."""
    if not any(type(existing) is type(listener) for existing in _listeners):
        _listeners.append(listener)


def alerts_fired(event: SlotAlerts) -> list[dict[str, Any]]:
    return [record for listener in _listeners for record in listener.alerts_fired(event)]


def rollout_failed(
    *,
    rollout: Rollout,
    rollback: Rollback | None,
    summary: str,
    detected_at: datetime,
    contract_version: int | None,
) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for listener in _listeners:
        record.update(
            listener.rollout_failed(
                rollout=rollout,
                rollback=rollback,
                summary=summary,
                detected_at=detected_at,
                contract_version=contract_version,
            )
        )
    return record


def rollback_progressed(*, rollback: Rollback, stage: Stage) -> None:
    for listener in _listeners:
        listener.rollback_progressed(rollback=rollback, stage=stage)


def remediation_progressed(
    *, run: RemediationRun, step: RemediationStep | None, message: str
) -> None:
    for listener in _listeners:
        listener.remediation_progressed(run=run, step=step, message=message)


def reload_failed(event: ReloadFailed) -> bool:
    return any([listener.reload_failed(event) for listener in _listeners])


def kv_integrity_violated(event: KvIntegrityViolated) -> bool:
    return any([listener.kv_integrity_violated(event) for listener in _listeners])
