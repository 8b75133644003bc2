"""incidents' side of KV cache integrity (serving.ops.health.kv_integrity): a replica whose
block pool broke an invariant (refcounts, owners, salts, free list) is a breach of its own
`kv-integrity:<slot>:<replica>` objective on the slot, a page (a broken pool may serve one
tenant's cached tokens to another, or leak blocks until it stalls), exactly once: the check and
the record run under the deployment's row lock."""

from __future__ import annotations

from incidents import services as incidents
from incidents.drills.selectors import active_run_id
from incidents.models import BreachKind
from serving.ops.events import KvIntegrityViolated


def record_kv_violation(event: KvIntegrityViolated) -> bool:
    """Record the violation unless it was before; True when recorded now."""
    deployment, report = event.deployment, event.report
    objective = event.key[:120]
    counts = {str(k): int(v) for k, v in (report.get("counts") or {}).items() if v}
    broken = ", ".join(f"{kind} ({n})" for kind, n in sorted(counts.items())) or "unknown"
    return incidents.breach_record_if_new(
        tenant=deployment.tenant,
        deployment=deployment,
        group="canary" if event.slot == "canary" else "stable",
        objective=objective,
        kind=BreachKind.GAUGE,
        severity="page",
        action="notify",
        detail=f"KV cache integrity broken on the {event.slot} slot (replica "
        f"{event.replica}): {broken}; restart the replica to start from an empty pool",
        observed={"slot": event.slot, "replica": event.replica, "counts": counts},
        detected_at=event.detected_at,
        drill_run_id=active_run_id(deployment.pk),
    )
