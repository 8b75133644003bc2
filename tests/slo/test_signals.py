"""The signal SLIs (serving.slo.signals): their arithmetic, their contract fields and the
errors that name them, and their evaluation from what the health tick observed."""

from __future__ import annotations

import math

import pytest

from serving.dataplane.guard import Refused
from serving.dataplane.signals import ReplicaSignals, failure_reason, request_failure
from serving.dataplane.sli import BOUNDS_MS
from serving.slo.evaluate import evaluate
from serving.slo.model import GAUGE_SLIS, Contract
from serving.slo.parse import parse_contract
from serving.slo.signals import (
    SIGNAL_SLIS,
    coefficient_of_variation,
    coverage,
    divergence,
    interpolated_quantile,
    series_value,
    slope_per_minute,
    spread,
)
from tests.slo.test_parse import errors_of

SIGNALS_CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: llm-signals
spec:
  window: 1h
  objectives:
    - {name: jitter, sli: latency_p99_jitter, max: 15, window: 2m}
    - {name: ttft-jitter, sli: ttft_jitter, max: 20}
    - {name: tps-stable, sli: throughput_cv, max: 0.3}
    - {name: cache-decay, sli: cache_hit_decay, max: 0.8}
    - {name: divergence, sli: state_divergence, max: 0.03}
    - {name: kv-quota, sli: errors_by_reason, reason: kv_quota, max: 0.05}
    - {name: queue, sli: queue_wait_ms, max: 200}
    - {name: busy, sli: saturation, max: 0.9}
    - {name: kv, sli: kv_use, max: 0.95}
    - {name: batch, sli: batch_occupancy, max: 1}
    - {name: trips, sli: breaker_trips, max: 2, window: 10m}
    - {name: golden, sli: output_consistency, min: 0.99}
    - {name: observed, sli: coverage, min: 1}
  critical_signals: [latency, ttft, kv_use, gpu_util, weights]
"""


def test_every_signal_sli_is_a_gauge_sli() -> None:
    assert set(SIGNAL_SLIS) <= set(GAUGE_SLIS)
    assert {"output_consistency", "coverage", "latency_p99_jitter"} <= set(GAUGE_SLIS)


def test_interpolated_quantile_is_linear_inside_its_bucket() -> None:
    hist = [0] * (len(BOUNDS_MS) + 1)
    hist[4] = 100  # all in (50, 100] ms
    assert interpolated_quantile(hist, BOUNDS_MS, 0.5) == pytest.approx(75.0)
    assert interpolated_quantile(hist, BOUNDS_MS, 0.99) == pytest.approx(99.5)
    overflow = [0] * len(BOUNDS_MS) + [3]
    assert interpolated_quantile(overflow, BOUNDS_MS, 0.99) == BOUNDS_MS[-1]
    assert math.isnan(interpolated_quantile([0] * 12, BOUNDS_MS, 0.99))


def test_spread_cv_and_slope() -> None:
    assert spread([10.0]) == 0.0
    assert spread([10.0, 30.0]) == pytest.approx(10.0)
    assert coefficient_of_variation([100.0, 100.0, 100.0]) == 0.0
    assert coefficient_of_variation([50.0, 150.0]) == pytest.approx(0.5)
    assert coefficient_of_variation([1.0]) is None
    # The hit ratio falls 0.01 a minute: 1 percentage point a minute.
    points = [(float(t), 0.9 - 0.01 * t / 60) for t in range(0, 300, 30)]
    assert slope_per_minute(points) == pytest.approx(-0.01)
    assert slope_per_minute(points[:2]) is None


def test_spread_in_floats_matches_the_exact_one() -> None:
    import random
    import statistics

    rng = random.Random(7)
    for size in (2, 3, 60, 120):
        values = [rng.uniform(0.0, 5000.0) for _ in range(size)]
        assert spread(values) == pytest.approx(statistics.pstdev(values), rel=1e-12)
        assert coefficient_of_variation(values) == pytest.approx(
            statistics.pstdev(values) / statistics.fmean(values), rel=1e-12
        )
    assert math.isnan(spread([1.0, math.nan]))  # statistics.pstdev raises here
    assert math.isnan(spread([math.inf, 1.0]))
    assert spread([1e300, -1e300]) == pytest.approx(1e300)  # squares beyond a float
    assert coefficient_of_variation([1e308, 1e308]) == 0.0


def _series(now: float) -> list[dict[str, object]]:
    return [
        {"t": now - 50, "s": 5, "req": 10, "p99": 20.0, "ttft": 10.0, "tps": 100.0, "hit": 0.9},
        {"t": now - 40, "s": 5, "req": 10, "p99": 60.0, "ttft": 10.0, "tps": 100.0, "hit": 0.8},
        {
            "t": now - 30,
            "s": 5,
            "req": 20,
            "p99": 20.0,
            "tps": 300.0,
            "hit": 0.7,
            "qs": 1.0,
            "qn": 10,
            "r": {"kv_quota": 2, "circuit_open": 5},
            "trips": 1,
            "sat": 0.5,
            "kv": 0.25,
            "bat": 0.75,
        },
        {"t": now - 900, "s": 5, "req": 1000, "p99": 9000.0, "r": {"kv_quota": 1000}},
    ]


def test_series_values_over_a_window_leave_older_points_out() -> None:
    now = 10_000.0
    series = _series(now)
    jitter, _ = series_value("latency_p99_jitter", series, now, 300)
    assert jitter == pytest.approx(spread([20.0, 60.0, 20.0]))
    assert series_value("ttft_jitter", series, now, 300)[0] == 0.0
    assert series_value("throughput_cv", series, now, 300)[0] == pytest.approx(
        coefficient_of_variation([100.0, 100.0, 300.0])
    )
    decay, _ = series_value("cache_hit_decay", series, now, 300)
    assert decay == pytest.approx(60.0)  # 0.1 lost every 10 s: 60 points a minute
    # 2 kv_quota failures of 40 requests + 5 turned away by the breaker.
    assert series_value("errors_by_reason", series, now, 300, "kv_quota")[0] == pytest.approx(
        2 / 45
    )
    assert series_value("queue_wait_ms", series, now, 300)[0] == pytest.approx(100.0)
    assert series_value("saturation", series, now, 300)[0] == 0.5
    assert series_value("kv_use", series, now, 300)[0] == 0.25
    assert series_value("batch_occupancy", series, now, 300)[0] == 0.75
    assert series_value("breaker_trips", series, now, 300)[0] == 1.0
    assert series_value("latency_p99_jitter", series, now, 15)[0] is None  # nothing that recent
    assert series_value("latency_p99_jitter", [], now, 300) == (None, "no samples yet")


def test_divergence_shows_a_replica_left_on_old_weights() -> None:
    same = {"version": "m:v2", "fingerprint": "abc", "kv_use": 0.5, "error_ratio": 0.0}
    assert divergence([{**same, "replica": "a"}, {**same, "replica": "b"}], "m:v2")["score"] == 0
    stale = {"replica": "b", "version": "m:v1", "fingerprint": "old", "kv_use": 0.5}
    found = divergence([{**same, "replica": "a"}, {**stale, "error_ratio": 0.3}], "m:v2")
    assert found["off"] == ["b"] and found["weights"] == 0.5 and found["errors"] == 0.3
    assert found["score"] == pytest.approx((0.5 + 0.0 + 0.3) / 3, abs=1e-4)
    # The same version, other weights under it (a fingerprint the others do not load).
    odd = {**same, "replica": "c", "fingerprint": "zzz"}
    found = divergence([{**same, "replica": "a"}, {**same, "replica": "b"}, odd], "m:v2")
    assert found["off"] == ["c"] and found["score"] > 0
    assert divergence([], "m:v2")["score"] is None


def test_coverage_is_collected_over_critical() -> None:
    assert coverage(["latency", "gpu_util"], ["latency", "ttft"]) == {
        "value": 0.5,
        "critical": ["gpu_util", "latency"],
        "missing": ["gpu_util"],
    }
    assert coverage(["latency"], ["latency"])["value"] == 1.0
    assert coverage([], ["latency"])["value"] is None


def test_failure_reasons_of_a_replica() -> None:
    assert failure_reason("kv_quota_exceeded", 429, None) == "kv_quota"
    assert failure_reason("context_length_exceeded", 400, None) is None  # the client's
    assert failure_reason("not_ready", 503, None) == "other"
    assert request_failure(MemoryError(), False) == "out_of_memory"
    assert request_failure(type("OutOfMemoryError", (RuntimeError,), {})(), False) == (
        "out_of_memory"
    )
    assert request_failure(TimeoutError(), False) == "timeout"
    assert request_failure(Refused(429, "kv_quota_exceeded", "full"), True) == "kv_quota"
    assert request_failure(None, True) is None  # the client went away
    signals = ReplicaSignals()
    signals.ended(queued_s=0.2, reason="timeout")
    signals.ended(queued_s=None, reason=None)
    out = signals.as_dict({"version": "m:v1", "fingerprint": "f"}, {"max_num_seqs": 8})
    assert out["errors"] == {"timeout": 1} and out["queue"] == {"sum_s": 0.2, "count": 1}
    assert (out["fingerprint"], out["max_num_seqs"], out["max_ongoing"]) == ("f", 8, None)


def test_a_contract_names_every_signal_sli_and_round_trips() -> None:
    contract = parse_contract(SIGNALS_CONTRACT)
    assert contract.objective("jitter").window == 120
    assert contract.objective("ttft-jitter").window == 300  # the default
    assert contract.objective("kv-quota").reason == "kv_quota"
    assert contract.objective("golden").limit == 0.99
    assert contract.critical == ("latency", "ttft", "kv_use", "gpu_util", "weights")
    # Signal SLIs read the tick's series: no Counts windows for them.
    assert contract.window_lengths() == [300, 3600]
    again = Contract.from_dict(contract.to_dict())
    assert again == contract
    default = parse_contract(SIGNALS_CONTRACT.replace("  critical_signals:", "  #"))
    assert default.critical_signals is None
    assert {"latency", "weights", "kv_use", "errors", "consistency"} <= set(default.critical)


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        (
            "reason: kv_quota, ",
            "",
            "spec.objectives[5].reason",
            "'reason' is required for sli 'errors_by_reason'",
        ),
        (
            "reason: kv_quota",
            "reason: gremlins",
            "spec.objectives[5].reason",
            "must be one of kv_quota, circuit_open",
        ),
        ("max: 0.03}", "max: 3}", "spec.objectives[4].max", "must be at most 1"),
        ("min: 0.99}", "max: 0.99}", "spec.objectives[11].min", "'min' is required"),
        ("max: 15, window: 2m", "max: 15, window: 1h", "spec.objectives[0].window", "10m"),
        ("max: 0.03}", "max: 0.03, window: 1m}", "spec.objectives[4].window", "does not apply"),
        ("[latency, ttft,", "[latency, tft,", "spec.critical_signals[1]", "must be one of"),
        (
            "sli: saturation, max: 0.9",
            "sli: saturation, reason: timeout, max: 0.9",
            "spec.objectives[7].reason",
            "does not apply",
        ),
    ],
)
def test_bad_signal_objectives_name_the_field(old: str, new: str, field: str, message: str) -> None:
    errors = errors_of(SIGNALS_CONTRACT.replace(old, new))
    assert any(e.field == field and message in e.message for e in errors), errors


def test_evaluation_reads_the_observations() -> None:
    contract = parse_contract(SIGNALS_CONTRACT)
    now = 10_000.0
    observations = {
        "group": "canary",
        "consistency": {"canary": 0.5},
        "signals": {
            "now": now,
            "series": _series(now),
            "divergence": divergence(
                [
                    {"replica": "a", "version": "m:v2", "fingerprint": "x"},
                    {"replica": "b", "version": "m:v1", "fingerprint": "y"},
                ],
                "m:v2",
            ),
            "coverage": coverage(contract.critical, ["latency", "ttft", "kv_use", "weights"]),
        },
    }
    result = evaluate(contract, {}, observations=observations)
    status = {s.name: s for s in result.objectives}
    assert status["jitter"].ok is False and status["jitter"].value == pytest.approx(
        spread([20.0, 60.0, 20.0])
    )
    assert status["divergence"].ok is False and "b" in status["divergence"].detail
    assert status["golden"].ok is False and status["golden"].value == 0.5
    assert status["observed"].value == 0.8 and status["observed"].ok is False
    assert "gpu_util" in status["observed"].detail
    assert status["batch"].ok is True and status["queue"].ok is True
    assert status["kv-quota"].ok is True and status["trips"].ok is True
    fired = {f.name for f in result.firing}
    assert {"jitter", "divergence", "golden", "observed"} <= fired
    # Nothing observed: no data, nothing fires.
    empty = evaluate(contract, {}, observations={})
    assert all(s.ok is None for s in empty.objectives) and not empty.firing
