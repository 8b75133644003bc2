"""Drills prove detection, not only survival: did the fault take effect (the replicas' own
reports, or the drill's own traffic and keys for control-side faults), and did the signal the
fault declares (catalogue `detectors`) move beyond the baseline taken at the injection?

A run records `effect_at` (first evidence), `detected_at` / `detected_by` (first declared
signal that moved; MTTD = detected_at - effect_at) and `detection` (baselines, last and peak
values, evidence). A fault that took effect but that no declared signal noticed fails as
"undetected".

Signals (kind: where the value comes from):

* `error_ratio`, `latency_p95` (sli): the slot's stored SLI rows;
* `contract` (sli): the contract fired: the ops loop opened this run's drill incident;
* `gpu_memory` (gpu): memory of the slot's processes in the GPU agent's latest samples;
* `replica_memory` (replica): the MB the slot's replicas report leaked (`fault_leaked_mb`;
  on a replica without a GPU that is simulated device memory, and the run says so);
* `replica_restarts` (replica): replicas that went away, in the stored rows' KV summary;
* `kv_use` (replica): KV blocks in use, in the stored rows' KV summary;
* `reloads` (replica): replicas that report the drill's hot reload done;
* `probe`: the drill's own probe saw it (the active fault's `detect`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from incidents.drills import faults as drill_faults
from incidents.drills.base import CATCH_UP_MAX_S, PROBE_WINDOW_S, record_event, to_datetime
from incidents.drills.faults.base import redis_client, replica_snapshots
from incidents.drills.models import DrillRun

BASELINE_S = 60.0  # SLI baselines: the stored rows of the minute before the injection
FRESH_S = 5.0  # a replica report older than this is a replica that went away
MEMORY_MOVE_MB = 64.0  # memory moved: at least this many MB above the baseline ...
MEMORY_MOVE_SHARE = 0.05  # ... and this share of it
ERROR_MOVE = 0.01  # error ratio moved: at least one point above the baseline, and doubled
LATENCY_MOVE_MS = 20.0  # p95 moved: at least this many ms above the baseline, and x1.5


@dataclass(frozen=True)
class Signal:
    kind: str  # sli | gpu | replica | probe
    title: str


SIGNALS: dict[str, Signal] = {
    "error_ratio": Signal("sli", "error ratio of the slot (stored SLI rows)"),
    "latency_p95": Signal("sli", "p95 latency of the slot (stored SLI rows)"),
    "contract": Signal("sli", "the contract fired: a drill incident opened"),
    "gpu_memory": Signal("gpu", "GPU memory of the slot's processes (GPU agent)"),
    "replica_memory": Signal("replica", "memory the slot's replicas report leaked"),
    "replica_restarts": Signal("replica", "replicas of the slot that went away"),
    "kv_use": Signal("replica", "KV cache blocks in use on the slot's replicas"),
    "reloads": Signal("replica", "replicas that report the drill's hot reload done"),
    "probe": Signal("probe", "the drill's own probe"),
}


def _mine(run: DrillRun, report: dict[str, Any]) -> bool:
    return str(report.get("drill")) == str(run.pk)


def fresh_reports(run: DrillRun, now: float) -> list[dict[str, Any]]:
    """The slot's replica snapshots, less those more than FRESH_S older than the newest (a
    replica that went away; the hash itself expires once no replica publishes)."""
    snaps = replica_snapshots(run.deployment, run.snapshot["group"])
    ends = [float((s.get("window") or {}).get("end") or 0) for s in snaps]
    newest = max(ends, default=0.0)
    return [s for s, end in zip(snaps, ends, strict=True) if newest - end <= FRESH_S]


def _faults(snap: dict[str, Any]) -> dict[str, Any]:
    return dict((snap.get("kv") or {}).get("faults") or {})


# Effect: what proves the fault took effect -------------------------------------------------


def effect_evidence(run: DrillRun, reports: list[dict[str, Any]], now: float) -> str | None:
    """Evidence that the fault is in effect now (None: none yet)."""
    active = drill_faults.of(run.fault)
    own = active.effect(run, now)  # the drill's own traffic or key (active faults)
    if own is not None or active.control_side:
        return own
    fault = run.fault
    for snap in reports:
        report, replica = _faults(snap), snap.get("replica")
        effects = report.get("effects") or {}
        counted = str(report.get("effects_drill")) == str(run.pk) and effects.get(fault)
        if fault in ("error_burst", "latency_spike") and counted:  # also after the revert
            what = "requests failed" if fault == "error_burst" else "requests delayed"
            return f"replica {replica}: {effects[fault]} {what} by the fault"
        if not _mine(run, report) or fault not in (report.get("active") or []):
            continue
        leak = report.get("leak") or {}
        if fault == "gpu_memory_leak" and float(leak.get("mb") or 0) > 0:
            where = "simulated device" if leak.get("simulated") else str(leak.get("device"))
            return f"replica {replica}: {leak['mb']} MB leaked ({where} memory)"
        if fault == "replica_hang" and report.get("hung"):
            return f"replica {replica} fails Serve's health check (hung by the fault)"
        if fault == "replica_crash" and report.get("crash_pending"):
            return f"replica {replica} is about to exit (crash pending)"
        if fault in ("kv_pollution_probe", "weight_swap_jitter"):
            return f"replica {replica} applies {fault} of this run"
    for snap in reports:
        reload = (snap.get("kv") or {}).get("fault_reload") or {}
        if fault == "weight_swap_jitter" and str(reload.get("drill")) == str(run.pk):
            return f"replica {snap.get('replica')} reloaded its weights for this run"
    if fault == "replica_crash":
        before = set((run.detection or {}).get("replicas_at_injection") or [])
        seen = {str(s.get("replica")) for s in reports}
        gone = sorted(before - seen)
        if gone:
            return f"replica(s) {', '.join(gone)} stopped reporting (crashed by the fault)"
    return None


# Signals: their value now and whether it moved ---------------------------------------------


def _gpu_memory_mb(run: DrillRun, now: float) -> float | None:
    from serving.telemetry.keys import gpu_keys

    raw = redis_client().hgetall(gpu_keys()["latest"])
    total, seen = 0.0, False
    for value in raw.values():
        try:
            sample = json.loads(value)
        except ValueError:
            continue
        if now - float(sample.get("at") or 0) > FRESH_S:
            continue
        for process in sample.get("processes") or []:
            mine = process.get("deployment_id") == run.deployment_id
            if mine and process.get("group") == run.snapshot["group"]:
                total += float(process.get("used_memory") or 0) / (1 << 20)
                seen = True
    return total if seen else None


def _rows_kv(run: DrillRun, since: float, until: float, key: str) -> list[float]:
    from serving.ops.selectors import raw_sli_rows

    rows = raw_sli_rows(
        deployment_id=run.deployment_id, group=run.snapshot["group"], since=since, until=until
    ).values_list("kv", flat=True)
    return [float((kv or {}).get(key) or 0) for kv in rows]


def _sli(
    run: DrillRun, name: str, since: float, until: float | None, ended_by: float | None = None
) -> float | None:
    """Error ratio or p95 latency (ms) of the slot's stored rows ending after `since` (and
    starting before `until`, ending by `ended_by`)."""
    from serving.dataplane.sli import quantile
    from serving.ops.selectors import raw_sli_rows

    stored = raw_sli_rows(
        deployment_id=run.deployment_id, group=run.snapshot["group"], since=since, until=until
    )
    if ended_by is not None:
        stored = stored.filter(end__lte=to_datetime(ended_by))
    rows = stored.values_list("requests", "errors", "latency")
    requests = errors = 0
    latency: list[int] = []
    for req, err, hist in rows:
        requests, errors = requests + req, errors + err
        hist = [int(b) for b in hist or []]
        latency = [a + b for a, b in zip(latency or [0] * len(hist), hist, strict=False)]
    if not requests:
        return None
    if name == "error_ratio":
        return errors / requests
    p95 = quantile(latency, 0.95)
    return None if p95 is None else float(p95)


def effect_since(run: DrillRun, reports: list[dict[str, Any]]) -> float | None:
    """When the fault reached the first replica that reports what it did (the replica's own
    clock, `effects_since`); None when no report says."""
    times = [
        float(report["effects_since"])
        for report in (_faults(s) for s in reports)
        if str(report.get("effects_drill")) == str(run.pk)
        and (report.get("effects") or {}).get(run.fault)
        and report.get("effects_since")
    ]
    return min(times, default=None)


def observed_window(run: DrillRun) -> tuple[float, float | None]:
    """The time the fault could touch requests: from when it reached a replica (else its
    injection) to its revert (None: still in). Requests before or after it would dilute the
    fault's p95 and error ratio with requests it never touched: a fault that took effect late
    (a worker killed holding the injection's reconcile) and the rows of the DETECTION_WAIT_S
    after the revert would hide a spike that lasted seconds."""
    injected = run.injected_at.timestamp() if run.injected_at else 0.0
    since = max(injected, float((run.detection or {}).get("effect_since") or 0.0))
    reverted = run.reverted_at.timestamp() if run.reverted_at else None
    return since, reverted if reverted is not None and reverted > since else None


def _baseline_sli(run: DrillRun, name: str, injected: float) -> float | None:
    """The minute before the injection: rows that started before it and, once a replica says
    when the fault reached it, ended by then. (A tick that stalled commits one row across the
    injection, delayed requests and all: it is not the baseline.)"""
    reached = (run.detection or {}).get("effect_since")
    ended_by = float(reached) if reached else None
    return _sli(run, name, injected - BASELINE_S, injected, ended_by)


def signal_value(
    run: DrillRun, name: str, reports: list[dict[str, Any]], now: float, *, baseline: bool
) -> float | None:
    """The signal's value now (baseline: just before the injection); None: no data."""
    injected = run.injected_at.timestamp() if run.injected_at else now
    if name in ("error_ratio", "latency_p95"):
        if baseline:
            return _baseline_sli(run, name, injected)
        since, until = observed_window(run)
        # Every row of that window (up to CATCH_UP_MAX_S back): a busy health tick commits
        # its row late, and a row a step missed must still count at the next one.
        return _sli(run, name, max(since, now - CATCH_UP_MAX_S), until)
    if name == "contract":
        return 0.0 if baseline or run.incident_id is None else 1.0
    if name == "gpu_memory":
        return _gpu_memory_mb(run, now)
    if name == "replica_memory":
        if not reports:
            return None
        return sum(float((s.get("kv") or {}).get("fault_leaked_mb") or 0) for s in reports)
    if name == "replica_restarts":
        return 0.0 if baseline else sum(_rows_kv(run, injected, now, "replica_restarts"))
    if name == "kv_use":
        since = now - PROBE_WINDOW_S if baseline else injected
        used = _rows_kv(run, since, now, "blocks_used")
        return max(used) if used else None
    if name == "reloads":
        done = [
            s
            for s in reports
            if str(((s.get("kv") or {}).get("fault_reload") or {}).get("drill")) == str(run.pk)
        ]
        return float(len(done))
    if name == "probe":
        return 0.0 if baseline or drill_faults.of(run.fault).detect(run) is None else 1.0
    raise KeyError(name)


def moved(name: str, base: float | None, value: float | None) -> bool:
    """Did the signal move beyond its baseline (the thresholds are this module's constants)?"""
    if value is None:
        return False
    base = base or 0.0
    if name == "error_ratio":
        return value - base >= max(ERROR_MOVE, base)
    if name == "latency_p95":
        return value - base >= max(LATENCY_MOVE_MS, 0.5 * base)
    if name in ("gpu_memory", "replica_memory"):
        return value - base >= max(MEMORY_MOVE_MB, MEMORY_MOVE_SHARE * base)
    if name == "kv_use":
        return value - base >= 2
    return value > base  # counts: contract, replica_restarts, reloads, probe


# The run's steps ---------------------------------------------------------------------------


def declared(run: DrillRun) -> list[str]:
    from incidents.drills.catalogue import CATALOGUE

    fault = CATALOGUE.get(run.fault)
    return list(fault.detectors) if fault is not None else []


def _guard(run: DrillRun, what: str, call: Callable[[], Any]) -> Any:
    return drill_faults.guarded(run, f"detection ({what})", call, None)


def take_baseline(run: DrillRun, now: float) -> None:
    """At the injection: each declared signal's value, and which replicas report now."""
    reports = _guard(run, "reports", lambda: fresh_reports(run, now)) or []
    base: dict[str, float | None] = {}
    for name in declared(run):
        read = partial(signal_value, run, name, reports, now, baseline=True)
        base[name] = _guard(run, name, read)
    run.detection = {
        "signals": declared(run),
        "baseline": base,
        "values": {},
        "replicas_at_injection": sorted(str(s.get("replica")) for s in reports),
    }


def step(run: DrillRun, now: float) -> None:
    """Each observing (and reverting) step: the effect, then each declared signal."""
    if run.injected_at is None or run.finished_at is not None:
        return
    state = dict(run.detection or {})
    reports = _guard(run, "reports", lambda: fresh_reports(run, now)) or []
    if run.effect_at is None:
        evidence = _guard(run, "effect", lambda: effect_evidence(run, reports, now))
        if evidence:
            run.effect_at = to_datetime(now)
            state["effect"] = evidence
            state["effect_since"] = effect_since(run, reports)
            run.detection = state
            record_event(run, "effective", f"the fault took effect: {evidence}")
    base = dict(state.get("baseline") or {})
    for name in ("error_ratio", "latency_p95"):  # rows a busy tick committed after the injection
        if name in base and base[name] is None and run.injected_at is not None:
            injected = run.injected_at.timestamp()
            base[name] = _guard(run, name, partial(_baseline_sli, run, name, injected))
    state["baseline"] = base
    values, peak = dict(state.get("values") or {}), dict(state.get("peak") or {})
    for name in declared(run):
        read = partial(signal_value, run, name, reports, now, baseline=False)
        value = _guard(run, name, read)
        values[name] = value
        if value is not None:
            peak[name] = max(float(peak.get(name) or value), value)
        if run.detected_by or not moved(name, base.get(name), value):
            continue
        at = now
        if name == "contract" and run.incident is not None:
            at = run.incident.triggered_at.timestamp()
        run.detected_at = to_datetime(min(at, now))
        run.detected_by = name
        state["simulated"] = name == "replica_memory" and _simulated(reports)
        label = " (simulated device memory)" if state["simulated"] else ""
        before = base.get(name)
        record_event(
            run,
            "signal_moved",
            f"detected by {name}{label}: {_fmt(before)} -> {_fmt(value)}",
            signal=name,
            baseline=before,
            value=value,
            simulated=state["simulated"],
        )
        break
    state["values"], state["peak"] = values, peak
    run.detection = state


def _simulated(reports: list[dict[str, Any]]) -> bool:
    return any(((_faults(s).get("leak") or {}).get("simulated")) for s in reports)


def _fmt(value: float | None) -> str:
    return "no data" if value is None else f"{value:g}"


def verdict(run: DrillRun) -> str | None:
    """The failed verdict when the fault never took effect or went unnoticed, else None."""
    names = declared(run)
    if not names:
        return f"undetected: {run.fault} declares no signal that should notice it"
    if run.effect_at is None:
        return (
            f"inconclusive: {run.fault} never took effect (no replica of the slot reported "
            "it for this run): nothing was there to detect"
        )
    if not run.detected_by:
        values = (run.detection or {}).get("values") or {}
        base = (run.detection or {}).get("baseline") or {}
        seen = ", ".join(f"{n} {_fmt(base.get(n))} -> {_fmt(values.get(n))}" for n in names)
        return (
            f"undetected: {run.fault} took effect ({(run.detection or {}).get('effect')}) but "
            f"none of its signals moved beyond its baseline ({seen})"
        )
    return None
