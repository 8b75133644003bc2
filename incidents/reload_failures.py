"""incidents' side of failed hot reloads (serving.ops.health.reloads): each failure is a breach
of its own `reload-failed:<slot>:<replica>:<at>` objective on the slot (a tier's on the stable
slot: it serves the stable traffic), a ticket (the old weights kept serving), exactly once: the
check and the record run under the deployment's row lock, and an alerted failure is found again
whatever its incident's state."""

from __future__ import annotations

from incidents import services as incidents
from incidents.drills.selectors import active_run_id
from incidents.models import BreachKind
from serving.ops.events import ReloadFailed


def record_reload_failure(event: ReloadFailed) -> bool:
    """Record the failed reload unless it was before; True when recorded now."""
    deployment, failure = event.deployment, event.failure
    objective = event.key[:120]
    what = failure.get("version") or failure.get("artifact") or "new weights"
    overran = "deadline" in str(failure.get("error", ""))
    # Ticks (and a tick beside a manual one) see the same failure: one records it.
    return incidents.breach_record_if_new(
        tenant=deployment.tenant,
        deployment=deployment,
        group="canary" if event.slot == "canary" else "stable",
        objective=objective,
        kind=BreachKind.RELOAD,
        severity="ticket",
        action="notify",
        detail=f"hot reload of {what} on the {event.slot} slot "
        f"{'overran its deadline' if overran else 'failed'} (replica {event.replica}): "
        f"{str(failure.get('error', ''))[:300]}; the old weights kept serving",
        observed={
            "slot": event.slot,
            "replica": event.replica,
            "deadline": overran,
            **{k: failure.get(k) for k in ("artifact", "version", "error", "at")},
        },
        detected_at=event.detected_at,
        drill_run_id=active_run_id(deployment.pk),
    )
