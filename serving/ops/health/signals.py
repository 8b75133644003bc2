"""The health tick's signal SLIs per slot (serving.slo.signals): from what every fresh replica
of the slot published (all of them, a replica left on other weights included), the routers'
breakers, the GPU agents' latest samples and the golden-prompt probe's score, it keeps a short
series of points (one at least every POINT_S seconds, SERIES_S of history, a capped list per
slot; the small per-tick state in the hash `<prefix>:health:signals`, see
serving.ops.health.series) and derives the slot's observations: divergence of its replicas,
observability coverage, and a summary the page and /metrics show."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from serving.dataplane.sli import BOUNDS_MS
from serving.ops.health import series as series_cache
from serving.ops.health.series import SUMMARY_WINDOW_S
from serving.ops.health.state import loads
from serving.slo.evaluate import Counts
from serving.slo.signals import (
    ERROR_REASONS,
    POINT_S,
    SERIES_S,
    SIGNAL_SLIS,
    coverage,
    divergence,
    interpolated_quantile,
    value_key,
)

GPU_FRESH_S = 30.0  # a GPU agent sample older than this collects nothing
CONSISTENCY_FRESH_S = 3600.0  # a probe result older than this is no longer collected
MAX_REPLICA_ROWS = 20  # the summary lists at most this many replicas (the page's table)

Pair = tuple[float, float]


def _ratio(used: float, total: float) -> float | None:
    return used / total if total > 0 else None


def _kv_use(kv: Mapping[str, Any]) -> float | None:
    total = float(kv.get("num_blocks") or 0)
    return _ratio(total - float(kv.get("free_blocks") or 0), total)


def _error_ratio(totals: Mapping[str, Any]) -> float | None:
    served = int(totals.get("requests", 0)) - int(totals.get("rejected", 0))
    return int(totals.get("errors", 0)) / served if served >= 5 else None


def _delta(now: float, before: float | None) -> float:
    """A counter's increase; a counter that went down restarted (its replica or breaker)."""
    if before is None:
        return 0.0  # first sight: a baseline only
    return now - before if now >= before else now


def _replica_counters(snapshot: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    kv = snapshot.get("kv") or {}
    mine = (kv.get("tenants") or {}).get(tenant) or {}
    signals = snapshot.get("signals") or {}
    queue = signals.get("queue") or {}
    return {
        "h": int(mine.get("prefix_hits", 0)),
        "q": int(mine.get("prefix_queries", 0)),
        "qs": float(queue.get("sum_s", 0.0)),
        "qn": int(queue.get("count", 0)),
        "r": {k: int(v) for k, v in (signals.get("errors") or {}).items() if k in ERROR_REASONS},
    }


def _collected(
    group: str,
    dep_id: int,
    replicas: Sequence[Mapping[str, Any]],
    breakers: Sequence[Mapping[str, Any]],
    gpu: Sequence[Mapping[str, Any]],
    extra: Sequence[str],
) -> list[str]:
    """The signals this slot collects now (what `critical_signals` are checked against)."""
    found: set[str] = set(extra)
    for snapshot in replicas:
        kv, signals = snapshot.get("kv") or {}, snapshot.get("signals") or {}
        if snapshot.get("totals"):
            found.update(("requests", "errors", "latency", "ttft", "itl", "tokens"))
        if "errors" in signals:
            found.add("error_reasons")
        if "queue" in signals:
            found.add("queue_wait")
        if int(kv.get("num_blocks") or 0) > 0:
            found.add("kv_use")
        if "running" in kv and signals.get("max_num_seqs"):
            found.add("batch_occupancy")
        if "running" in kv and signals.get("max_ongoing"):
            found.add("saturation")
        if isinstance(kv.get("tenants"), dict):
            found.add("cache_hits")
        if signals.get("fingerprint"):
            found.add("weights")
    if breakers:
        found.add("breaker")
    for sample in gpu:
        devices = {d.get("uuid"): d for d in sample.get("devices") or []}
        for process in sample.get("processes") or []:
            if process.get("deployment_id") == dep_id and process.get("group") == group:
                found.add("gpu_memory")
                if devices.get(process.get("device_uuid"), {}).get("gpu_util") is not None:
                    found.add("gpu_util")
    return sorted(found)


def _new_acc() -> dict[str, Any]:
    hist = [0] * (len(BOUNDS_MS) + 1)
    return {"s": 0.0, "lat": hist, "ttft": list(hist), "tok": 0, "req": 0, "hq": [0, 0]}


def _add(acc: dict[str, Any], key: str, value: float) -> None:
    acc[key] = acc.get(key, 0) + value


def _flush(acc: Mapping[str, Any], now: float) -> dict[str, Any]:
    """One series point from an accumulator (keys as serving.slo.signals says)."""
    seconds = float(acc["s"])
    point: dict[str, Any] = {"t": round(now, 3), "s": round(seconds, 3), "req": acc["req"]}
    p99 = interpolated_quantile(acc["lat"], BOUNDS_MS, 0.99)
    ttft = interpolated_quantile(acc["ttft"], BOUNDS_MS, 0.95)
    if p99 == p99:  # not NaN
        point["p99"] = round(p99, 3)
    if ttft == ttft:
        point["ttft"] = round(ttft, 3)
    if acc["req"] and seconds > 0:
        point["tps"] = round(acc["tok"] / seconds, 3)
    hits, queries = acc["hq"]
    if queries:
        point["hit"] = round(hits / queries, 5)
    for key in ("qs", "qn", "trips"):
        if acc.get(key):
            point[key] = round(acc[key], 6)
    if acc.get("r"):
        point["r"] = acc["r"]
    for key in ("sat", "kv", "bat"):
        total, n = acc.get(key) or (0.0, 0)
        if n:
            point[key] = round(total / n, 5)
    return point


def slot_signals(
    *,
    now: float,
    dep_id: int,
    tenant_id: int,
    group: str,
    version: str,
    replicas: Sequence[Mapping[str, Any]],
    delta: Counts,
    routers: Sequence[Mapping[str, Any]],
    gpu: Sequence[Mapping[str, Any]],
    consistency: Mapping[str, Any] | None,
    reported: Mapping[str, Any],
    critical: Sequence[str] | None,
    state: Mapping[str, Any] | None,
    series: list[dict[str, Any]] | None = None,
    objectives: Sequence[tuple[str, int | None, str | None]] = (),
    interval_s: float = 0.0,
) -> tuple[dict[str, Any], str, str | None]:
    """(the slot's observations for evaluate(), its new signal state, the series point to
    append or None); adds what the routers' breakers turned away to `delta`, as failed.
    `series`: the slot's points, read only when its state said a point may close."""
    state = dict(state or {})
    tenant = str(tenant_id)
    acc = state.get("acc") or _new_acc()
    acc["s"] += delta.seconds
    acc["lat"] = [a + b for a, b in zip(acc["lat"], delta.latency, strict=False)]
    acc["ttft"] = [a + b for a, b in zip(acc["ttft"], delta.ttft, strict=False)]
    acc["tok"] += delta.tokens_out
    acc["req"] += delta.requests
    reasons: dict[str, int] = dict(acc.get("r") or {})
    old_base = state.get("base") or {}
    base: dict[str, Any] = {}
    thrown = 0  # failures replicas reported from an exception: the router's breaker saw them
    for snapshot in replicas:
        replica = str(snapshot.get("replica"))
        now_c, before = _replica_counters(snapshot, tenant), old_base.get(replica)
        base[replica] = now_c
        if before is None:
            continue
        acc["hq"][0] += _delta(now_c["h"], before["h"])
        acc["hq"][1] += _delta(now_c["q"], before["q"])
        _add(acc, "qs", _delta(now_c["qs"], before["qs"]))
        _add(acc, "qn", _delta(now_c["qn"], before["qn"]))
        for reason, count in now_c["r"].items():
            grown = int(_delta(count, before["r"].get(reason, 0)))
            if grown:
                reasons[reason] = reasons.get(reason, 0) + grown
                thrown += grown if reason in THROWN_REASONS else 0
    old_rbase = state.get("rbase") or {}
    rbase: dict[str, Any] = {}
    breakers = [r["breakers"][group] for r in routers if group in (r.get("breakers") or {})]
    recorded = 0  # failures the routers' breakers recorded (each a version's failure)
    for router in routers:
        breaker = (router.get("breakers") or {}).get(group)
        if breaker is None:
            continue
        name, before = str(router.get("replica")), old_rbase.get(str(router.get("replica")))
        now_b = {k: int(breaker.get(k, 0)) for k in ("trips", "failures", "turned_away")}
        rbase[name] = now_b
        if before is not None:
            _add(acc, "trips", _delta(now_b["trips"], before["trips"]))
            recorded += int(_delta(now_b["failures"], before["failures"]))
            grown = int(_delta(now_b["turned_away"], before["turned_away"]))
            if grown:  # refused by the router: no replica ever saw these
                reasons["circuit_open"] = reasons.get("circuit_open", 0) + grown
                # the version's failures: a canary its breaker shields is still rolled back
                delta.requests, delta.errors = delta.requests + grown, delta.errors + grown
    upstream, fu = _upstream(state.get("fu"), recorded, thrown)
    if upstream:
        reasons["upstream"] = reasons.get("upstream", 0) + upstream
    if reasons:
        acc["r"] = reasons
    instant = _instant(replicas)
    for key, value in instant.items():
        if value is not None:
            total, n = acc.get(key) or (0.0, 0)
            acc[key] = [total + value, n + 1]
    point, cache = None, state.get("cache") or {}
    stale = (  # a point added unread, or values a new objective needs: recompute when read
        not cache
        or bool(state.get("dirty"))
        or any(value_key(*o) not in (cache.get("values") or {}) for o in objectives)
    )
    if acc["s"] >= POINT_S:
        point = _flush(acc, now)
        acc = _new_acc()
    if series is not None:
        kept = [p for p in series if float(p["t"]) > now - SERIES_S]
        if point is not None:
            kept.append(point)
        if point is not None or stale:
            cache, stale = series_cache.computed(kept, now, objectives), False
    # The first tick that may close the point: not before POINT_S are accumulated, nor before
    # the slot is due again (every `interval_s`). A point added unread (its state said not
    # yet) or values a new objective needs make the next tick read the series.
    stale = stale or (point is not None and series is None)
    next_at = 0.0 if stale else max(now + POINT_S - acc["s"], now + interval_s - 0.25)
    rows = [
        {
            "replica": str(s.get("replica")),
            "version": str(s.get("version", "")),
            "fingerprint": str((s.get("signals") or {}).get("fingerprint") or ""),
            "kv_use": _kv_use(s.get("kv") or {}),
            "error_ratio": _error_ratio(s.get("totals") or {}),
        }
        for s in replicas
        if s.get("version")  # none yet: loading its first weights, not off
    ]
    # A probe result counts while fresh and of the version the slot serves now (a canary's
    # new version must not inherit its predecessor's score).
    if consistency is not None and (
        now - float(consistency.get("at", 0)) > CONSISTENCY_FRESH_S
        or consistency.get("version") not in (None, version)
    ):
        consistency = None
    fresh_probe = consistency is not None
    extra = [k for k in ("drift", "freshness") if reported.get(k)]
    collected = _collected(group, dep_id, replicas, breakers, gpu, extra)
    if fresh_probe:
        collected = sorted({*collected, "consistency"})
    observed = {
        "now": now,
        "values": cache.get("values") or {},
        "summary": cache.get("summary") or {},
        "divergence": divergence(rows, version),
        "coverage": {**coverage(critical or (), collected), "collected": collected},
        "replicas": rows[:MAX_REPLICA_ROWS],
        "instant": instant,
        "consistency": consistency,
    }
    new_state = {"acc": acc, "base": base, "rbase": rbase, "fu": fu, "cache": cache}
    if stale:
        new_state["dirty"] = True
    encoded_point = None if point is None else json.dumps(point, separators=(",", ":"))
    count = series_cache.points_needed(objectives)
    return observed, series_cache.encode_state(new_state, next_at, count), encoded_point


# A replica's reasons for a request ended by an exception (the router's breaker records it too)
THROWN_REASONS = frozenset({"other", "out_of_memory", "timeout"})


def _upstream(fu: Any, recorded: int, thrown: int) -> tuple[int, dict[str, Any]]:
    """How many of the routers' recorded failures no replica reported (`upstream`: a replica
    that died or never answered), each counted once. Published apart, a router's failure gets
    two ticks for its replica's report to arrive: upstream so far = max(router failures two
    ticks ago - replica-reported ones now), never less than before (attributed once)."""
    fu = dict(fu or {})
    history = list(fu.get("rh") or [0, 0])
    total_r = int(history[-1]) + recorded
    total_p = int(fu.get("p", 0)) + thrown
    attributed = int(fu.get("u", 0))
    now_u = max(attributed, int(history[0]) - total_p)
    return now_u - attributed, {"rh": [int(history[-1]), total_r], "p": total_p, "u": now_u}


def _instant(replicas: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The slot's saturation now: requests in the engines over Serve's limit, KV blocks used
    over the blocks, running sequences over the batch size (summed over its replicas)."""
    used = blocks = running = batch = ongoing = limit = 0.0
    for snapshot in replicas:
        kv, signals = snapshot.get("kv") or {}, snapshot.get("signals") or {}
        blocks += float(kv.get("num_blocks") or 0)
        used += float(kv.get("num_blocks") or 0) - float(kv.get("free_blocks") or 0)
        if "running" in kv and signals.get("max_num_seqs"):
            running += float(kv["running"])
            batch += float(signals["max_num_seqs"])
        if "running" in kv and signals.get("max_ongoing"):
            ongoing += float(kv["running"]) + float(kv.get("waiting") or 0)
            limit += float(signals["max_ongoing"])
    return {
        "sat": _ratio(ongoing, limit),
        "kv": _ratio(used, blocks),
        "bat": _ratio(running, batch),
    }


def summary(observed: Mapping[str, Any]) -> dict[str, Any]:
    """What the page and /metrics show of a slot's signals: each windowed SLI over the last
    SUMMARY_WINDOW_S (as computed when the last point was added), errors by reason,
    divergence, coverage, consistency, the replicas."""
    values: dict[str, Any] = dict(observed.get("summary") or {})
    for sli, (_, _, windowed) in SIGNAL_SLIS.items():
        if windowed and sli != "errors_by_reason":
            values.setdefault(sli, None)
    values.setdefault("errors_by_reason", dict.fromkeys(ERROR_REASONS))
    values["state_divergence"] = observed["divergence"].get("score")
    values["coverage"] = observed["coverage"].get("value")
    consistency = observed.get("consistency") or {}
    values["output_consistency"] = consistency.get("score")
    return {
        "window_s": SUMMARY_WINDOW_S,
        "values": values,
        "divergence": observed["divergence"],
        "coverage": observed["coverage"],
        "replicas": observed["replicas"],
        "consistency": consistency or None,
    }


def decode_all(raw: Mapping[bytes, bytes] | None, fresh_after: float, at: str) -> list[Any]:
    """The JSON values of a hash whose `at` field is newer than `fresh_after`."""
    out = []
    for value in (raw or {}).values():
        try:
            item = json.loads(value)
        except ValueError:
            continue
        if isinstance(item, dict) and float(item.get(at, 0) or 0) > fresh_after:
            out.append(item)
    return out


def consistency_of(raw: Any) -> dict[str, Any] | None:
    """A golden-prompt probe's stored result, or None when absent or malformed."""
    try:
        value = loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("score"), int | float):
        return None
    score = float(value["score"])
    try:  # one malformed value must not stop the tick for every deployment
        at = float(value.get("at") or 0)
    except (TypeError, ValueError):
        return None
    if not 0.0 <= score <= 1.0 or not math.isfinite(at):
        return None
    found = {"score": score, "at": at, "detail": str(value.get("detail"))}
    if isinstance(value.get("version"), str):
        found["version"] = value["version"]  # the slot's version label when it was probed
    return found


def kv_summary(replicas: list[dict[str, Any]], tenant_id: str, gone: int) -> dict[str, Any]:
    """The slot's KV cache over its replicas of the current version, for the stored rows."""
    total = sum(int(r.get("kv", {}).get("num_blocks", 0)) for r in replicas)
    free = sum(int(r.get("kv", {}).get("free_blocks", 0)) for r in replicas)
    mine = [r.get("kv", {}).get("tenants", {}).get(tenant_id, {}) for r in replicas]
    return {
        "blocks_total": total,
        "blocks_used": total - free,
        "preemptions": sum(int(m.get("preemptions", 0)) for m in mine),
        "evictions": sum(int(m.get("evictions", 0)) for m in mine),
        "fragmentation": max(
            (float(r.get("kv", {}).get("fragmentation", 0)) for r in replicas), default=0.0
        ),
        "replicas": len(replicas),
        "replica_restarts": gone,
    }
