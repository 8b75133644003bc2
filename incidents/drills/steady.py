"""The steady-state hypothesis: the contract (what fires now) and probes over stored SLI rows."""

from __future__ import annotations

from typing import Any

from incidents.drills.base import CATCH_UP_MAX_S, PROBE_WINDOW_S
from incidents.drills.models import DrillRun


def measure(
    deployment_id: int, group: str, now: float, since: float | None = None
) -> dict[str, Any]:
    """The slot's SLIs over the last PROBE_WINDOW_S seconds of stored rows, or since `since`
    when that is earlier (up to CATCH_UP_MAX_S back)."""
    from serving.dataplane.sli import quantile
    from serving.ops import selectors as ops

    window_start = now - PROBE_WINDOW_S
    if since is not None:
        window_start = max(min(window_start, since), now - CATCH_UP_MAX_S)
    rows = ops.raw_sli_rows(
        deployment_id=deployment_id, group=group, since=window_start
    ).values_list("requests", "errors", "latency", "start", "end")
    requests = errors = 0
    latency = [0] * 12
    span = 0.0
    for req, err, hist, start, end in rows:
        requests += req
        errors += err
        latency = [a + int(b) for a, b in zip(latency, hist or [0] * 12, strict=False)]
        span += (end - start).total_seconds()
    error_rate = errors / requests if requests else 0.0
    return {
        "requests": requests,
        "error_rate": error_rate,
        "availability": 1.0 - error_rate,
        "latency_p95_ms": quantile(latency, 0.95) if requests else None,
        "rps": requests / span if span else 0.0,
    }


def firing_alerts(deployment_id: int, group: str) -> list[dict[str, Any]]:
    from serving.ops.selectors import deployment_health

    try:
        info = deployment_health(deployment_id)
    except Exception:  # Redis away: no verdict from the contract this step
        return []
    return list(((info.get("slots") or {}).get(group) or {}).get("firing") or [])


def steady_state(run: DrillRun, now: float) -> tuple[bool, list[dict[str, Any]]]:
    """Does the hypothesis hold? Each probe (and the contract, as one probe) with its value."""
    hypothesis = run.snapshot.get("steady_state") or {}
    group = run.snapshot["group"]
    results: list[dict[str, Any]] = []
    if hypothesis.get("contract", True):
        # What fires now; not an exhausted error budget: that lasts the contract's window (days)
        # after the slot is healthy again, and would fail every later drill of the slot.
        firing = [f for f in firing_alerts(run.deployment_id, group) if f.get("kind") != "budget"]
        results.append(
            {
                "name": "contract",
                "held": not firing,
                "weight": 1,
                "value": [f.get("name") for f in firing],
            }
        )
    probes = hypothesis.get("probes") or []
    if probes:
        window = measure(run.deployment_id, group, now, run.previous_step_at)
        for probe in probes:
            value = window[probe["sli"]]
            if "max" in probe:
                held = value is None or value <= probe["max"]
            else:
                held = value is not None and window["requests"] > 0 and value >= probe["min"]
            results.append(
                {"name": probe["name"], "held": held, "weight": probe["weight"], "value": value}
            )
    return all(r["held"] for r in results), results
