"""`control_plane_delay`: the portal's Serve API calls held through a TTL'd Redis key."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from incidents.drills.faults.base import (
    DELAY_MEASURE_EVERY_S,
    ActiveFault,
    fault_state,
    record_event,
    redis_client,
    store_fault_state,
)
from incidents.drills.models import DrillRun
from serving.deployments.services import reconcile_on_commit

logger = logging.getLogger(__name__)

# Compare-and-delete: a run removes its own delay only, never another run's.
_DELETE_IF_OURS = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


class ControlPlaneDelay(ActiveFault):
    control_side = True
    lingers = True

    def _value(self, run: DrillRun) -> str:
        # The same in every step: a resumed injection finds its own key and carries on.
        delay = run.snapshot["parameters"]["delay_ms"]
        return json.dumps({"run": run.pk, "delay_ms": delay}, sort_keys=True)

    def inject(self, run: DrillRun, now: float) -> str | None:
        from incidents.drills.base import TTL_GRACE_S
        from serving.deployments.chaos import control_delay_key

        ttl = int(run.snapshot["duration_s"]) + TTL_GRACE_S
        store_fault_state(
            run,
            {
                "expires_at": round(now + ttl, 3),
                "api_calls": [],
                "reconciles": [],
                "reconcile_seen": 0,
            },
        )
        value, key = self._value(run), control_delay_key()
        r = redis_client()
        if not r.set(key, value, nx=True, ex=ttl) and r.get(key) != value.encode():
            holder = r.get(key)
            return f"aborted: another control_plane_delay is in force ({holder!r})"
        return None

    def _measure(self, run: DrillRun, state: dict[str, Any], now: float, label: str) -> None:
        """One real Serve API call through the portal's client, timed."""
        from serving.control.cluster import ray_target_from_env
        from serving.control.serve_api import ServeApiError

        started = time.perf_counter()
        error = None
        try:
            ray_target_from_env().serve_client().applications()
        except ServeApiError as exc:
            error = str(exc)[:200]
        ms = round((time.perf_counter() - started) * 1000, 1)
        state["api_calls"] = [
            *(state.get("api_calls") or []),
            {"at": round(now, 3), "ms": ms, "when": label, "error": error},
        ][-50:]
        record_event(
            run,
            "serve_api_call",
            f"Serve API call ({label}) took {ms:.0f} ms" + (f": {error}" if error else ""),
            ms=ms,
            error=error,
        )

    def _reconciles(self, run: DrillRun, state: dict[str, Any]) -> None:
        """Reconciles that finished since the injection (the drill asks for one with each
        measurement), with their durations."""
        from serving.deployments.models import ReconcileRun

        if run.injected_at is None:
            return
        finished = ReconcileRun.objects.filter(
            started_at__gte=run.injected_at,
            finished_at__isnull=False,
            pk__gt=int(state.get("reconcile_seen", 0)),
        ).order_by("pk")[:20]
        for reconcile in finished:
            ms = round(float(reconcile.duration_ms or 0), 1)
            state["reconciles"] = [
                *(state.get("reconciles") or []),
                {"ms": ms, "skipped": reconcile.skipped, "ok": reconcile.ok},
            ][-50:]
            state["reconcile_seen"] = reconcile.pk
            record_event(
                run,
                "reconcile",
                f"reconcile took {ms:.0f} ms"
                + (" (nothing to apply)" if reconcile.skipped else ""),
                ms=ms,
                skipped=reconcile.skipped,
                ok=reconcile.ok,
            )

    def observe(self, run: DrillRun, now: float) -> str | None:
        state = fault_state(run)
        self._reconciles(run, state)
        if now - float(state.get("measured_at", 0)) >= DELAY_MEASURE_EVERY_S:
            self._measure(run, state, now, "delayed")
            state["measured_at"] = now
            reconcile_on_commit(always=True)  # slowed like any other
        store_fault_state(run, state)
        return None

    def revert(self, run: DrillRun, now: float) -> str:
        from serving.deployments.chaos import control_delay_key

        removed = redis_client().eval(_DELETE_IF_OURS, 1, control_delay_key(), self._value(run))
        return "delay removed" if removed else "the delay key was already gone (TTL)"

    def wind_down(self, run: DrillRun, now: float) -> None:
        state = fault_state(run)
        self._reconciles(run, state)
        if not state.get("measured_after"):
            self._measure(run, state, now, "after the revert")
            state["measured_after"] = True
        store_fault_state(run, state)

    def effect(self, run: DrillRun, now: float) -> str | None:
        from serving.deployments.chaos import control_delay_key

        held = redis_client().get(control_delay_key())
        return "the delay key is in force" if held == self._value(run).encode() else None

    def detect(self, run: DrillRun) -> str | None:
        delay = float(run.snapshot["parameters"]["delay_ms"])
        calls = fault_state(run).get("api_calls") or []
        slow = [c["ms"] for c in calls if c.get("when") == "delayed" and c["ms"] >= delay * 0.95]
        return f"a Serve API call took {slow[0]:.0f} ms" if slow else None

    def failure(self, run: DrillRun) -> str | None:
        state = fault_state(run)
        delay = float(run.snapshot["parameters"]["delay_ms"])
        delayed = [c for c in state.get("api_calls") or [] if c.get("when") == "delayed"]
        if not any(c["ms"] >= delay * 0.95 for c in delayed):
            return (
                f"inconclusive: no Serve API call was slowed by {delay:g} ms (measured "
                f"{[c['ms'] for c in delayed]})"
            )
        return None
