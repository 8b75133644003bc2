"""`weight_swap_jitter`: repeated hot reloads of the slot's weights under traffic; 0 failed
requests."""

from __future__ import annotations

import logging
from typing import Any

from incidents.drills.faults.base import (
    ActiveFault,
    fault_state,
    record_event,
    replica_snapshots,
    require_whole,
    store_fault_state,
)
from incidents.drills.models import ChaosDrill, DrillRun
from portal.exceptions import ValidationFailed

logger = logging.getLogger(__name__)


class WeightSwapJitter(ActiveFault):
    def check(self, drill: ChaosDrill) -> None:
        require_whole(drill, "reloads")
        params = drill.parameters
        need = (int(params["reloads"]) - 1) * float(params["interval_s"])
        if need >= drill.duration_s:
            raise ValidationFailed(
                f"{params['reloads']} reloads every {params['interval_s']} s need a duration_s "
                f"over {need:g} s (it is {drill.duration_s}).",
                field="parameters.reloads",
            )

    def data_plane(self, run: DrillRun, params: dict[str, Any]) -> dict[str, Any]:
        return {"reload": 1}  # the injection is the first reload

    def injected(self, run: DrillRun, now: float) -> None:
        store_fault_state(run, {"reloads_written": 1, "last_reload_at": now, "applied": {}})
        number = run.fault_revision.number if run.fault_revision else "?"
        record_event(
            run,
            "reload",
            f"hot reload 1/{run.snapshot['parameters']['reloads']} (revision {number})",
        )

    def _nonce(self, run: DrillRun) -> int | None:
        """The nonce in the current revision, while the fault there is this run's."""
        revision = run.deployment.current_revision
        group = (revision.faults or {}).get(run.snapshot["group"]) if revision else None
        if not group or group.get("drill") != str(run.pk):
            return None
        return int((group.get("weight_swap_jitter") or {}).get("reload", 0)) or None

    def _read(self, run: DrillRun, state: dict[str, Any], now: float) -> None:
        """Which reload each replica reports done (and how long it took), and the slot's
        requests and errors since the injection."""
        applied = dict(state.get("applied") or {})
        for snapshot in replica_snapshots(run.deployment, run.snapshot["group"]):
            reload = (snapshot.get("kv") or {}).get("fault_reload") or {}
            if reload.get("drill") == str(run.pk):
                applied[str(snapshot.get("replica"))] = {
                    k: reload.get(k) for k in ("nonce", "ok", "s")
                }
        state["applied"] = applied
        state["failed_reloads"] = sorted(r for r, a in applied.items() if a.get("ok") is False)
        if run.injected_at is not None:
            window = _slot_counts(run, run.injected_at.timestamp(), now)
            state["requests"], state["errors"] = window

    def observe(self, run: DrillRun, now: float) -> str | None:
        from serving.deployments import services as deployments

        state = fault_state(run)
        self._read(run, state, now)
        nonce = self._nonce(run)
        params = run.snapshot["parameters"]
        due = now - float(state.get("last_reload_at", 0)) >= float(params["interval_s"])
        if nonce is not None and nonce < int(params["reloads"]) and due:
            group = run.snapshot["group"]
            faults = dict(run.deployment.current_revision.faults or {})  # type: ignore[union-attr]
            faults[group] = {**faults[group], "weight_swap_jitter": {"reload": nonce + 1}}
            revision = deployments.deployment_change(
                tenant=run.deployment.tenant,
                actor=_actor(run),
                deployment=run.deployment,
                changes={"faults": faults},
                reason=f"drill {run.drill.name} (run {run.pk}): hot reload {nonce + 1}/"
                f"{params['reloads']}",
                action="drill.weight_reload",
            )
            state["reloads_written"] = nonce + 1
            state["last_reload_at"] = now
            record_event(
                run,
                "reload",
                f"hot reload {nonce + 1}/{params['reloads']} (revision {revision.number})",
                revision=revision.number,
            )
        store_fault_state(run, state)
        return None

    def wind_down(self, run: DrillRun, now: float) -> None:
        state = fault_state(run)
        self._read(run, state, now)
        store_fault_state(run, state)

    def failure(self, run: DrillRun) -> str | None:
        state = fault_state(run)
        if state.get("failed_reloads"):
            return f"hot reload failed on replicas {', '.join(state['failed_reloads'])}"
        if state.get("errors"):
            return (
                f"{state['errors']} of {state.get('requests', 0)} requests failed while the "
                f"weights were hot-reloaded {state.get('reloads_written', 0)} times"
            )
        if not state.get("applied"):
            return "inconclusive: no replica reported a hot reload of this drill"
        return None


def _slot_counts(run: DrillRun, since: float, now: float) -> tuple[int, int]:
    """Requests and errors the health ticks stored for the slot between `since` and `now`."""
    from django.db.models import Sum

    from serving.ops.selectors import raw_sli_rows

    totals = raw_sli_rows(
        deployment_id=run.deployment_id, group=run.snapshot["group"], since=since, until=now
    ).aggregate(requests=Sum("requests"), errors=Sum("errors"))
    return int(totals["requests"] or 0), int(totals["errors"] or 0)


def _actor(run: DrillRun) -> Any:
    from tenants.actors import Actor

    return Actor(system=f"drill run {run.pk}")
