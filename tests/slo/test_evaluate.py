"""Evaluating contracts: burn rates, budgets, fast rules, gauges and the promotion gate.

Every expected number is worked out by hand in the comment beside it.
"""

from __future__ import annotations

import json

import pytest

from serving.slo.evaluate import (
    Counts,
    Evaluation,
    Firing,
    bin_counts,
    budget,
    burn_rate,
    evaluate,
    gate_check,
    good_total,
    psi,
)
from serving.slo.parse import parse_contract
from tests.slo.contracts import FULL, MINIMAL

HOUR, MIN5, DAY30 = 3600, 300, 30 * 86400
AVAILABILITY = parse_contract(MINIMAL.format(window="30d"))  # target 0.999, the default alerts
FULL_CONTRACT = parse_contract(FULL)


def served(requests: int, errors: int = 0, rejected: int = 0) -> Counts:
    return Counts(requests=requests, errors=errors, rejected=rejected)


def hist(**buckets: int) -> list[int]:
    """hist(b100=50) puts 50 observations in the bucket whose upper bound is 100 ms."""
    bounds = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]
    out = [0] * 12
    for key, count in buckets.items():
        out[11 if key == "inf" else bounds.index(int(key[1:]))] = count
    return out


# (1h counts, 5m counts, min_requests, expected burn over 1h, over 5m, fires)
# fmt: off
BURN_CASES = [
    # 150/10000 = 1.5% bad; / 0.1% budget = 15.0.  20/1000 = 2% -> 20.0. Both >= 14.4: page.
    pytest.param(served(10000, 150), served(1000, 20), 1, 15.0, 20.0, True, id="both-burn"),
    # Long window 15.0 but short 10/1000 = 1% -> 10.0 < 14.4: the fire is already out.
    pytest.param(served(10000, 150), served(1000, 10), 1, 15.0, 10.0, False, id="short-below"),
    # Long 100/10000 = 1% -> 10.0 < 14.4, short 20.0: a blip, not a sustained burn.
    pytest.param(served(10000, 100), served(1000, 20), 1, 10.0, 20.0, False, id="long-below"),
    # Exactly at the threshold: 144/10000 = 1.44% -> 14.4 (>=), 15/1000 -> 15.0.
    pytest.param(served(10000, 144), served(1000, 15), 1, 14.4, 15.0, True, id="at-threshold"),
    # Short window 1 error in 5 requests -> 20% -> 200.0, but 5 < min_requests 10.
    pytest.param(served(10000, 150), served(5, 1), 10, 15.0, 200.0, False, id="min-requests"),
    pytest.param(served(10000, 150), served(5, 1), 5, 15.0, 200.0, True, id="min-requests-met"),
    # 4xx are the client's: 1100 requests, 100 rejected -> 1000 served, 20 errors -> 20.0.
    pytest.param(served(10000, 150), served(1100, 20, 100), 1, 15.0, 20.0, True, id="rejected-out"),
    # Only rejections, no server errors: burn 0 in both windows, nothing fires.
    pytest.param(served(10000, 0, 150), served(1000, 0, 20), 1, 0.0, 0.0, False, id="only-4xx"),
    # No traffic at all: burn rates are unknown (None), nothing fires.
    pytest.param(Counts(), Counts(), 1, None, None, False, id="no-traffic"),
]
# fmt: on


@pytest.mark.parametrize(
    ("long", "short", "min_requests", "burn_long", "burn_short", "fires"), BURN_CASES
)
def test_burn_rate_alert(
    long: Counts,
    short: Counts,
    min_requests: int,
    burn_long: float | None,
    burn_short: float | None,
    fires: bool,
) -> None:
    result = evaluate(AVAILABILITY, {HOUR: long, MIN5: short}, min_requests=min_requests)

    (status,) = result.objectives
    assert status.burn_rates["1h"] == (None if burn_long is None else pytest.approx(burn_long))
    assert status.burn_rates["5m"] == (None if burn_short is None else pytest.approx(burn_short))
    burns = [f for f in result.firing if f.kind == "burn"]
    if fires:
        (firing,) = burns  # only the 14.4x 1h/5m rule has data in both of its windows
        assert (firing.name, firing.severity, firing.action) == ("availability", "page", "rollback")
        assert firing.detail == (
            f"error budget of 'availability' burning {burn_long:.1f}x over 1h and "
            f"{burn_short:.1f}x over 5m (threshold 14.4x)"
        )
        assert result.worst_action == "rollback"
    else:
        assert burns == []


def test_latency_objective_counts_buckets_up_to_the_threshold() -> None:
    p95 = FULL_CONTRACT.objective("p95")  # threshold 500 ms, target 0.95
    # 50 at <=100 ms, 30 at <=250, 10 at <=500 (good: 90), 6 at <=1000, 4 at <=2500 (bad: 10).
    counts = Counts(latency=hist(b100=50, b250=30, b500=10, b1000=6, b2500=4))

    assert good_total(p95, counts) == (90, 100)
    # 10% bad against a 5% budget: burn 2.0.
    assert burn_rate(p95, counts) == pytest.approx(2.0)
    # ttft has its own histogram; the latency one does not count for it.
    assert good_total(p95, Counts(ttft=hist(b5000=3))) == (0, 0)


def test_budget_exhausted_over_the_window() -> None:
    objective = AVAILABILITY.objective("availability")
    # 30d: 1e6 requests at 0.999 allow 1000 bad; 1500 bad -> remaining 1 - 1500/1000 = -0.5.
    spent = budget(objective, served(1_000_000, 1500))
    assert (spent.total, spent.bad, spent.allowed_bad) == (1_000_000, 1500, 1000.0)
    assert spent.remaining == pytest.approx(-0.5)
    assert spent.exhausted

    result = evaluate(AVAILABILITY, {DAY30: served(1_000_000, 1500)})
    status = result.objectives[0]
    assert status.ok is False
    assert status.value == pytest.approx(0.9985)  # 998500 / 1e6
    (firing,) = result.firing
    assert (firing.kind, firing.severity, firing.action) == ("budget", "ticket", "notify")


def test_budget_edges() -> None:
    objective = AVAILABILITY.objective("availability")
    # Exactly 1000 bad of 1000 allowed: spent, not overspent.
    spent = budget(objective, served(1_000_000, 1000))
    assert (spent.remaining, spent.exhausted) == (0.0, False)
    # 250 bad of 1000 allowed: 75% left.
    assert budget(objective, served(1_000_000, 250)).remaining == pytest.approx(0.75)
    # No traffic: the whole budget is left, and the objective has no data (not a failure).
    empty = budget(objective, Counts())
    assert (empty.total, empty.remaining, empty.exhausted) == (0, 1.0, False)
    status = evaluate(AVAILABILITY, {}).objectives[0]
    assert (status.ok, status.value, status.budget) == (None, None, empty)


@pytest.mark.parametrize(
    ("counts", "fires"),
    [
        (served(20, 3), True),  # 3/20 = 15% > 10%
        (served(20, 2), False),  # 2/20 = 10%: not above
        (served(9, 5), False),  # 55% but 9 < min_requests 10
        (served(30, 3, rejected=10), True),  # 3/(30-10) = 15%: 4xx left out
        (served(30, 3, rejected=0), False),  # 3/30 = 10%
    ],
)
def test_fast_error_rule(counts: Counts, fires: bool) -> None:
    result = evaluate(FULL_CONTRACT, {15: counts})
    fast = [f for f in result.firing if f.kind == "fast"]
    assert bool(fast) == fires
    if fires:
        assert (fast[0].name, fast[0].action, fast[0].severity) == (
            "error-spike",
            "rollback",
            "page",
        )
        assert fast[0].value == pytest.approx(0.15)


def test_fast_latency_rule_uses_the_histogram_quantile() -> None:
    text = MINIMAL.format(window="30d") + (
        "  fast:\n    - {name: slow, sli: latency_p95, above_ms: 1000, for: 30s, action: pause}\n"
    )
    contract = parse_contract(text)
    # 80 at <=100 ms, 10 at <=1000, 10 at <=2500: the 95th of 100 is in the 2500 bucket.
    slow = Counts(requests=100, latency=hist(b100=80, b1000=10, b2500=10))
    # 80 at <=100, 20 at <=1000: p95 is 1000, not above 1000.
    fine = Counts(requests=100, latency=hist(b100=80, b1000=20))

    (firing,) = evaluate(contract, {30: slow}).firing
    assert (firing.kind, firing.value, firing.action) == ("fast", 2500.0, "pause")
    assert "latency_p95 2500 ms over 30s is above 1000 ms" in firing.detail
    assert evaluate(contract, {30: fine}).firing == []
    # Fewer observations than min_requests (default 10): quiet.
    assert evaluate(contract, {30: Counts(latency=hist(b10000=9))}).firing == []


@pytest.mark.parametrize(
    ("counts", "value", "ok"),
    [
        (Counts(requests=10, tokens_out=9000, seconds=300), 30.0, True),  # 9000/300 = 30 >= 20
        (Counts(requests=10, tokens_out=3000, seconds=300), 10.0, False),  # 10 < 20
        (Counts(requests=10, tokens_out=3000, seconds=100), 30.0, True),  # younger than 5m
        (Counts(requests=10, tokens_out=3000), 10.0, False),  # no span given: the 5m window
        (Counts(), None, None),  # idle is not slow: no data
    ],
)
def test_tokens_per_second_gauge(counts: Counts, value: float | None, ok: bool | None) -> None:
    result = evaluate(FULL_CONTRACT, {300: counts})
    status = next(s for s in result.objectives if s.name == "throughput")

    assert (status.kind, status.limit, status.ok) == ("gauge", 20, ok)
    assert status.value == (None if value is None else pytest.approx(value))
    gauges = [f for f in result.firing if f.kind == "gauge"]
    assert [(f.name, f.severity, f.action) for f in gauges] == (
        [("throughput", "ticket", "notify")] if ok is False else []
    )


def test_psi_against_hand_computed_values() -> None:
    # p = [.1, .4, .4, .1], q = [.2, .4, .3, .1]:
    # (.2-.1)*ln(2) + 0 + (.3-.4)*ln(.75) + 0 = 0.0693147 + 0.0287682 = 0.0980829
    assert psi([10, 40, 40, 10], [20, 40, 30, 10]) == pytest.approx(0.0980829, abs=1e-6)
    assert psi([10, 40, 40, 10], [1, 4, 4, 1]) == pytest.approx(0.0)  # same shape
    # An empty bin counts as 1e-4: p = [.5, .5], q = [1, 1e-4]:
    # .5*ln(2) + (1e-4 - .5)*ln(1e-4/.5) = 0.346574 + 4.257745 = 4.604319
    assert psi([50, 50], [100, 0]) == pytest.approx(4.604319, abs=1e-5)
    with pytest.raises(ValueError, match="bins"):
        psi([1, 2], [1, 2, 3])


def test_drift_and_freshness_gauges() -> None:
    # Drift [70, 10, 10, 10] vs [10, 40, 40, 10]: q = [.7, .1, .1, .1]
    # .6*ln(7) + 2 * (-.3)*ln(.25) = 1.167546 + 0.831777 = 1.999323 > 0.2
    observations = {"drift": {"prompt_length": [70, 10, 10, 10]}, "freshness": {"user_profile": 60}}
    result = evaluate(FULL_CONTRACT, {}, observations=observations)
    by_name = {s.name: s for s in result.objectives}

    assert by_name["prompt-drift"].value == pytest.approx(1.999323, abs=1e-5)
    assert by_name["prompt-drift"].ok is False
    assert (by_name["profile-fresh"].value, by_name["profile-fresh"].ok) == (60.0, True)
    assert [f.name for f in result.firing if f.kind == "gauge"] == ["prompt-drift"]

    stale = evaluate(FULL_CONTRACT, {}, observations={"freshness": {"user_profile": 3600}})
    fresh = next(s for s in stale.objectives if s.name == "profile-fresh")
    assert fresh.ok is False and "1h ago (maximum 15m)" in fresh.detail

    nothing = evaluate(FULL_CONTRACT, {})  # gauges without observations are "no data"
    assert all(s.ok is None for s in nothing.objectives)
    assert nothing.firing == [] and nothing.worst_action is None

    wrong = evaluate(FULL_CONTRACT, {}, observations={"drift": {"prompt_length": [1, 2]}})
    assert next(s for s in wrong.objectives if s.name == "prompt-drift").ok is None


def test_bin_counts_put_outliers_in_the_end_bins() -> None:
    assert bin_counts([0, 16, 64, 256, 1024], [-1, 0, 15, 16, 300, 5000]) == [3, 1, 0, 2]


def test_gate_check() -> None:
    # Gate: availability (0.999) and p95 (<=500 ms for 0.95), at least 50 events.
    fast_latency = hist(b100=1000)
    good = Counts(requests=1000, latency=fast_latency)
    result = gate_check(FULL_CONTRACT, good, stable=Counts(requests=500, errors=1))
    assert (result.passed, result.failed) == (True, [])
    assert "stable 99.8%" in result.detail  # 499/500

    # 5 errors of 1000 = 99.5% < 99.9%.
    failing = gate_check(FULL_CONTRACT, Counts(requests=1000, errors=5, latency=fast_latency))
    assert failing.passed is False
    assert failing.failed == ["availability: 99.5% good, below 99.9%"]

    # 100 of 1000 slower than 500 ms = 90% < 95%.
    slow = Counts(requests=1000, latency=hist(b100=900, b1000=100))
    assert gate_check(FULL_CONTRACT, slow).failed == ["p95: 90% good, below 95%"]

    # 20 requests < 50: not enough data yet.
    early = gate_check(FULL_CONTRACT, Counts(requests=20, latency=hist(b100=20)))
    assert early.passed is None and "20 of 50" in early.detail


@pytest.mark.parametrize(
    ("actions", "worst"),
    [
        (["notify", "rollback", "pause"], "rollback"),
        (["notify", "pause"], "pause"),
        (["notify"], "notify"),
        ([], None),
    ],
)
def test_worst_action(actions: list[str], worst: str | None) -> None:
    firing = [Firing("burn", "x", "page", action, "") for action in actions]
    assert Evaluation(objectives=[], firing=firing).worst_action == worst


def test_counts_arithmetic_and_round_trip() -> None:
    a = Counts(requests=10, errors=2, latency=hist(b100=10), seconds=5.0)
    b = Counts(requests=4, errors=3, latency=hist(b100=4, b250=1), seconds=1.0)

    total = a + b
    assert (total.requests, total.errors, total.seconds) == (14, 5, 6.0)
    assert total.latency == hist(b100=14, b250=1)
    diff = a - b  # clamped at 0 per field (a restarted replica's counters)
    assert (diff.requests, diff.errors, diff.latency) == (6, 0, hist(b100=6))
    assert Counts.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    with pytest.raises(ValueError, match="12 buckets"):
        Counts(latency=[0, 1])


def test_counts_from_a_dataplane_window() -> None:
    window: dict[str, object] = {"start": 100.0, "end": 101.5, "requests": 3, "rejected": 1}
    window |= {"tokens_out": 9, "latency_ms": hist(b50=3), "ttft_ms": hist(b25=2)}
    counts = Counts.from_dict(window)
    assert (counts.requests, counts.rejected, counts.tokens_out, counts.seconds) == (3, 1, 9, 1.5)
    assert counts.ttft == hist(b25=2)


def test_evaluation_to_dict_is_json() -> None:
    overflow = Counts(requests=20, latency=hist(inf=20))
    contract = parse_contract(
        MINIMAL.format(window="30d")
        + "  fast:\n    - {name: slow, sli: latency_p95, above_ms: 100, for: 30s, action: pause}\n"
    )
    result = evaluate(contract, {30: overflow, DAY30: served(1000, 500)})

    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["worst_action"] == "pause"
    slow = next(f for f in data["firing"] if f["kind"] == "fast")
    assert slow["value"] is None and "over 10000 ms" in slow["detail"]
    assert data["objectives"][0]["budget"]["exhausted"] is True
