"""Statistics of the benchmarks. CONVENTIONS: figures are ratios against a baseline measured in
the same run, never absolute timings asserted anywhere."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; `values` must not be empty."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def percentile_or_none(values: Sequence[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def median(values: Sequence[float], digits: int | None = None) -> float | None:
    """The median (None for no values), rounded to `digits` when given."""
    if not values:
        return None
    value = statistics.median(values)
    return round(value, digits) if digits is not None else value


def summarise(times_s: Sequence[float]) -> dict[str, float]:
    """Request timings (seconds) as req/s, mean, p50 and p95 in ms."""
    return {
        "requests": len(times_s),
        "total_s": round(sum(times_s), 4),
        "req_per_s": round(len(times_s) / sum(times_s), 1),
        "mean_ms": round(statistics.fmean(times_s) * 1000, 3),
        "p50_ms": round(statistics.median(times_s) * 1000, 3),
        "p95_ms": round(percentile(times_s, 0.95) * 1000, 3),
    }


def p50_p99(values_ms: Sequence[float], digits: int = 3) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values_ms), digits),
        "p99": round(percentile(values_ms, 0.99), digits),
    }


def ratio(candidate: float, baseline: float, digits: int = 3) -> float:
    """candidate / baseline, both measured in the same run."""
    return round(candidate / baseline, digits)
