"""The LLM-grade gauge SLIs the seeds name (jitter, throughput stability, prefix-cache decay,
state divergence, errors by reason, queue wait, saturation, breaker trips, output consistency,
observability coverage): what each is, which signals it reads, and the arithmetic over the
per-slot series the health tick keeps (`observations["signals"]`, see serving.ops.health).

Pure: no Django, no Redis. A series point is a dict written by the tick at most every
POINT_S seconds: t (end), s (seconds covered), req (requests), p99 and ttft (interpolated
quantiles, ms), tps (tokens/s), hit (prefix-cache hit ratio), qs/qn (queue wait sum, s, and
count), r ({reason: failures}), trips (breaker trips), sat/kv/bat (saturation ratios).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

# name -> (direction of the threshold, unit shown, reads a window of the series)
SIGNAL_SLIS: dict[str, tuple[str, str, bool]] = {
    "latency_p99_jitter": ("max", "ms", True),
    "ttft_jitter": ("max", "ms", True),
    "throughput_cv": ("max", "", True),
    "cache_hit_decay": ("max", "%/min", True),
    "state_divergence": ("max", "", False),
    "errors_by_reason": ("max", "", True),
    "queue_wait_ms": ("max", "ms", True),
    "saturation": ("max", "", True),
    "kv_use": ("max", "", True),
    "batch_occupancy": ("max", "", True),
    "breaker_trips": ("max", "trips", True),
    "output_consistency": ("min", "", False),
    "coverage": ("min", "", False),
}
# SLIs whose threshold is a fraction: at most 1.
FRACTION_SLIS = frozenset(
    {
        "state_divergence",
        "errors_by_reason",
        "saturation",
        "kv_use",
        "batch_occupancy",
        "output_consistency",
        "coverage",
    }
)
ERROR_REASONS = ("kv_quota", "circuit_open", "upstream", "out_of_memory", "timeout", "other")
# The series covers this much history; a windowed signal SLI's window must fit in it.
SERIES_S = 600
POINT_S = 5.0
SERIES_WINDOW = (30, SERIES_S)
# The seeds' typical thresholds (003 §1, 000 §4.3), shown beside the measured values.
SEED_THRESHOLDS = {"latency_p99_jitter": 15.0, "cache_hit_decay": 0.8, "state_divergence": 0.03}

# Every signal a slot may collect: what `critical_signals` may name.
SIGNALS = (
    "requests",
    "errors",
    "latency",
    "ttft",
    "itl",
    "tokens",
    "error_reasons",
    "queue_wait",
    "saturation",
    "kv_use",
    "batch_occupancy",
    "cache_hits",
    "weights",
    "breaker",
    "gpu_util",
    "gpu_memory",
    "consistency",
    "drift",
    "freshness",
)
# Which signals each SLI reads: a contract's default critical signals.
SLI_SIGNALS: dict[str, tuple[str, ...]] = {
    "availability": ("requests", "errors"),
    "error_rate": ("requests", "errors"),
    "latency_p50": ("latency",),
    "latency_p95": ("latency",),
    "latency_p99": ("latency",),
    "ttft_p95": ("ttft",),
    "itl_p95": ("itl",),
    "tokens_per_s": ("tokens",),
    "drift_psi": ("drift",),
    "feature_freshness": ("freshness",),
    "latency_p99_jitter": ("latency",),
    "ttft_jitter": ("ttft",),
    "throughput_cv": ("tokens",),
    "cache_hit_decay": ("cache_hits",),
    "state_divergence": ("weights", "kv_use", "errors"),
    "errors_by_reason": ("error_reasons", "breaker"),
    "queue_wait_ms": ("queue_wait",),
    "saturation": ("saturation",),
    "kv_use": ("kv_use",),
    "batch_occupancy": ("batch_occupancy",),
    "breaker_trips": ("breaker",),
    "output_consistency": ("consistency",),
    "coverage": (),
}


def interpolated_quantile(histogram: Sequence[int], bounds: Sequence[float], q: float) -> float:
    """The q-quantile (ms) of a bucketed histogram, linear inside its bucket (Prometheus'
    histogram_quantile); the overflow bucket answers its lower bound. Empty: NaN."""
    total = sum(histogram)
    if total <= 0:
        return math.nan
    rank = q * total
    seen = 0.0
    for index, count in enumerate(histogram):
        if count and seen + count >= rank:
            if index >= len(bounds):
                return float(bounds[-1])
            low = 0.0 if index == 0 else float(bounds[index - 1])
            return low + (float(bounds[index]) - low) * (rank - seen) / count
        seen += count
    return float(bounds[-1])


def _pstdev(values: Sequence[float], mean: float) -> float:
    """Population standard deviation in floats (math.fsum): statistics.pstdev's exact
    fractions cost ~180 us for 60 values, and a 10,000-deployment tick takes tens of thousands
    of them each time its slots close a point. A non-finite value gives NaN."""
    value = math.sqrt(math.fsum((x - mean) * (x - mean) for x in values) / len(values))
    if math.isfinite(value):
        return value
    if not all(math.isfinite(x) for x in values):
        return math.nan
    return statistics.pstdev(values)  # finite values whose squares go beyond a float


def _fmean(values: Sequence[float]) -> float:
    try:
        return math.fsum(values) / len(values)
    except OverflowError:  # beyond a float on the way: exact fractions
        return float(statistics.mean(values))
    except ValueError:  # inf and -inf
        return math.nan


def spread(values: Sequence[float]) -> float:
    """Population standard deviation; 0 for fewer than two values."""
    return _pstdev(values, _fmean(values)) if len(values) >= 2 else 0.0


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = _fmean(values)
    return None if mean <= 0 else _pstdev(values, mean) / mean


def slope_per_minute(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t seconds, y) in y-units per minute; None under 3 points."""
    if len(points) < 3:
        return None
    ts = [t for t, _ in points]
    ys = [y for _, y in points]
    mean_t, mean_y = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mean_t) ** 2 for t in ts)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (y - mean_y) for t, y in points)
    return cov / var * 60.0


def divergence(replicas: Sequence[Mapping[str, Any]], desired_version: str) -> dict[str, Any]:
    """How far apart a slot's replicas are, in [0, 1]: the mean of three parts, each in
    [0, 1]: the share of replicas not on the desired weights (another version, or a
    fingerprint other than the one most replicas of the desired version load), the spread
    (max - min) of their KV use, and the spread of their error ratios (replicas with at least
    5 requests). `replicas`: {"replica", "version", "fingerprint", "kv_use", "error_ratio"}."""
    if not replicas:
        return {"score": None, "weights": None, "kv": None, "errors": None, "off": []}
    on_version = [r for r in replicas if r.get("version") == desired_version]
    prints = [str(r.get("fingerprint") or "") for r in on_version]
    modal = max(set(prints), key=prints.count) if prints else None
    off = [
        str(r.get("replica"))
        for r in replicas
        if r.get("version") != desired_version or str(r.get("fingerprint") or "") != modal
    ]
    weights = len(off) / len(replicas)
    kv_uses = [float(r["kv_use"]) for r in replicas if r.get("kv_use") is not None]
    kv = (max(kv_uses) - min(kv_uses)) if len(kv_uses) >= 2 else 0.0
    ratios = [float(r["error_ratio"]) for r in replicas if r.get("error_ratio") is not None]
    errors = (max(ratios) - min(ratios)) if len(ratios) >= 2 else 0.0
    score = (weights + kv + errors) / 3.0
    return {
        "score": round(score, 4),
        "weights": round(weights, 4),
        "kv": round(kv, 4),
        "errors": round(errors, 4),
        "off": sorted(off),
    }


def coverage(critical: Sequence[str], collected: Sequence[str]) -> dict[str, Any]:
    """C = |collected ∩ critical| / |critical| (seed 003 §3.1); None with nothing critical."""
    wanted = sorted(set(critical))
    have = set(collected)
    missing = [s for s in wanted if s not in have]
    value = None if not wanted else (len(wanted) - len(missing)) / len(wanted)
    return {"value": value, "critical": wanted, "missing": missing}


def within(series: Sequence[Mapping[str, Any]], now: float, window: float) -> list[Any]:
    return [p for p in series if float(p.get("t", 0)) > now - window]


def _values(points: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(p[key]) for p in points if p.get(key) is not None]


def series_value(
    sli: str,
    series: Sequence[Mapping[str, Any]],
    now: float,
    window: float,
    reason: str | None = None,
) -> tuple[float | None, str]:
    """The value of a windowed signal SLI over the last `window` seconds, and a why-None."""
    return points_value(sli, within(series, now, window), reason)


def points_value(
    sli: str, points: Sequence[Mapping[str, Any]], reason: str | None = None
) -> tuple[float | None, str]:
    """series_value over points already cut to the window (`within`): a tick that computes
    several SLIs over one window cuts it once."""
    if not points:
        return None, "no samples yet"
    if sli in ("latency_p99_jitter", "ttft_jitter"):
        values = _values(points, "p99" if sli == "latency_p99_jitter" else "ttft")
        if len(values) < 2:
            return None, "fewer than 2 samples with requests"
        return spread(values), f"spread of {len(values)} samples"
    if sli == "throughput_cv":
        cv = coefficient_of_variation(_values(points, "tps"))
        return cv, "" if cv is not None else "fewer than 2 samples with tokens"
    if sli == "cache_hit_decay":
        slope = slope_per_minute([(float(p["t"]), float(p["hit"])) for p in points if "hit" in p])
        if slope is None:
            return None, "fewer than 3 samples with prefix lookups"
        return -slope * 100.0, "percentage points of hit ratio lost per minute"
    if sli == "errors_by_reason":
        failed = sum(int((p.get("r") or {}).get(reason or "", 0)) for p in points)
        turned = sum(int((p.get("r") or {}).get("circuit_open", 0)) for p in points)
        attempts = sum(int(p.get("req", 0)) for p in points) + turned
        if attempts == 0:
            return None, "no requests"
        return failed / attempts, f"{failed} of {attempts} requests failed with '{reason}'"
    if sli == "queue_wait_ms":
        count = sum(int(p.get("qn", 0)) for p in points)
        if count == 0:
            return None, "no scheduled requests"
        return sum(float(p.get("qs", 0.0)) for p in points) / count * 1000.0, f"{count} requests"
    if sli in ("saturation", "kv_use", "batch_occupancy"):
        key = {"saturation": "sat", "kv_use": "kv", "batch_occupancy": "bat"}[sli]
        values = _values(points, key)
        return (statistics.fmean(values), "") if values else (None, "not published")
    if sli == "breaker_trips":
        return float(sum(int(p.get("trips", 0)) for p in points)), ""
    return None, f"'{sli}' is not a series SLI"


def value_key(sli: str, window: int | None, reason: str | None) -> str:
    """The key of a windowed SLI's value the health tick caches (`signals["values"]`)."""
    return f"{sli}|{int(window or 300)}|{reason or ''}"


def observed_value(
    sli: str, window: int | None, reason: str | None, observations: Mapping[str, Any]
) -> tuple[float | None, str]:
    """A signal SLI's value from what the health tick observed of the slot, and a detail."""
    signals = observations.get("signals") or {}
    if sli == "output_consistency":
        score = (observations.get("consistency") or {}).get(observations.get("group", "stable"))
        if score is None:
            return None, "no golden-prompt probe result yet"
        return float(score), "fraction of golden prompts answered as recorded"
    if sli == "coverage":
        found = signals.get("coverage") or {}
        missing = ", ".join(found.get("missing") or []) or "none"
        return found.get("value"), f"missing: {missing}"
    if sli == "state_divergence":
        found = signals.get("divergence") or {}
        if found.get("score") is None:
            return None, "no replica published"
        off = ", ".join(found.get("off") or []) or "none"
        return float(found["score"]), f"replicas off the desired weights: {off}"
    seconds = float(window or 300)
    if "values" in signals:  # what the tick computed when it added the last point
        value, why = (signals["values"] or {}).get(
            value_key(sli, window, reason), (None, "computed when the next point is added")
        )
        return value, f"{why} over {int(seconds)}s" if why else why
    series = signals.get("series") or []
    value, why = series_value(sli, series, float(signals.get("now", 0.0)), seconds, reason)
    return value, f"{why} over {int(seconds)}s" if why else why
