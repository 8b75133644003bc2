"""The canary's breaker held against its stable (serving.dataplane.breaker.CanaryBreaker): a
minimum scaled to its share, slow calls as bad as errors, the comparison with the stable's own
rate; and the router wiring it to its stable on every reconfigure."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from serving.dataplane.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    STARTUP_GRACE_S,
    BreakerConfig,
    CanaryBreaker,
    CircuitBreaker,
    binomial_tail,
)
from tests.dataplane.canary_router import StandInCanary, canary_router


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pair(share: float = 0.2, **config: float) -> tuple[Clock, CircuitBreaker, CanaryBreaker]:
    clock = Clock()
    settings = BreakerConfig.from_dict(config)
    stable = CircuitBreaker(settings, clock)
    return clock, stable, CanaryBreaker(settings, clock, baseline=stable, share=share)


def _serve(clock: Clock, breaker: CircuitBreaker, outcomes: list[tuple[bool, float]]) -> None:
    for ok, seconds in outcomes:
        clock.now += max(0.01, seconds)  # answered `seconds` after it was sent
        if breaker.allow():
            breaker.record(ok, seconds)


def test_the_minimum_scales_with_the_canarys_share_of_the_traffic() -> None:
    assert _pair(0.2)[2].min_requests() == 4  # 20 x 20%
    assert _pair(0.5)[2].min_requests() == 10
    assert _pair(0.01)[2].min_requests() == 3  # the floor
    assert _pair(1.0, min_requests=30)[2].min_requests() == 30


def test_two_errors_among_its_last_calls_open_it_beside_a_clean_stable() -> None:
    clock, stable, canary = _pair()
    _serve(clock, stable, [(True, 0.01)] * 200)
    _serve(clock, canary, [(True, 0.01)] * 40)
    canary.record(False)
    assert canary.state == CLOSED  # one error proves nothing
    clock.now += 0.01
    canary.record(True, 0.01)
    canary.record(False)
    assert canary.state == OPEN and canary.trips == 1
    assert canary.last_test < 0.001
    assert not canary.allow() and canary.turned_away == 1
    # The plain breaker with the same settings would still be closed: 2 of 43 in its window.
    plain = CircuitBreaker(canary.config, clock)
    _serve(clock, plain, [(True, 0.01)] * 41 + [(False, 0.0), (True, 0.01), (False, 0.0)])
    assert plain.state == CLOSED


def test_slow_calls_count_as_bad_against_the_stables_p95() -> None:
    clock, stable, canary = _pair()
    _serve(clock, stable, [(True, 0.02)] * 100)  # p95 20 ms: slow above the 250 ms floor
    _serve(clock, canary, [(True, 0.2)] * 40)  # slower, but not slow
    assert canary.state == CLOSED
    _serve(clock, canary, [(True, 0.5), (True, 0.03), (True, 0.5)])
    assert canary.state == OPEN
    assert canary.snapshot()["slow_ms"] == 250.0
    # Three times a slower stable's p95 (200 ms: 600 ms) is above the floor.
    clock, stable, canary = _pair()
    _serve(clock, stable, [(True, 0.2)] * 100)
    _serve(clock, canary, [(True, 0.2)] * 30 + [(True, 0.5), (True, 0.2), (True, 0.5)])
    assert canary.state == CLOSED and canary.snapshot()["slow_ms"] == 600.0
    # An explicit threshold wins over the stable's.
    clock, stable, canary = _pair(slow_ms=1000)
    _serve(clock, stable, [(True, 0.02)] * 100)
    _serve(clock, canary, [(True, 0.5)] * 40)
    assert canary.state == CLOSED


def test_a_slow_half_open_probe_opens_it_again() -> None:
    clock, stable, canary = _pair(open_s=1, half_open_probes=2)
    _serve(clock, stable, [(True, 0.01)] * 100)
    _serve(clock, canary, [(True, 0.01)] * 20 + [(False, 0.0)] * 2)
    assert canary.state == OPEN
    clock.now += 1.5
    assert canary.allow() and canary.state == HALF_OPEN
    clock.now += 2.0
    canary.record(True, 2.0)
    assert canary.state == OPEN and canary.trips == 2


@pytest.mark.parametrize("rate", [0.01, 0.1])
def test_a_canary_as_good_as_a_flaky_stable_is_left_alone(rate: float) -> None:
    """Both fail `rate` of their calls at random: the comparison must not see a worse canary
    (at 1%, two failures in the canary's last four would be 'unlikely' at the 1% floor)."""
    rng = random.Random(7)
    clock, stable, canary = _pair(window_s=30, min_requests=20)
    for _ in range(20000):
        clock.now += 0.01
        breaker = canary if rng.random() < 0.2 else stable
        if breaker.allow():
            breaker.record(rng.random() >= rate, 0.01)
    assert canary.trips == 0 and stable.trips == 0


def test_the_comparison_is_off_at_alpha_zero_and_while_the_stable_is_open() -> None:
    clock, stable, canary = _pair(canary_alpha=0)
    _serve(clock, stable, [(True, 0.01)] * 100)
    _serve(clock, canary, [(False, 0.0), (True, 0.01), (False, 0.0)])
    assert canary.state == CLOSED  # the failure rate alone: 2 of 3, below the minimum of 4
    clock, stable, canary = _pair()
    _serve(clock, stable, [(False, 0.0)] * 20)
    assert stable.state == OPEN
    _serve(clock, canary, [(False, 0.0), (True, 0.01), (False, 0.0)])
    assert canary.state == CLOSED  # nothing to hold it against: the canary is all there is


def test_binomial_tail() -> None:
    assert binomial_tail(0, 5, 0.3) == pytest.approx(1.0)
    assert binomial_tail(2, 4, 0.01) == pytest.approx(1 - 0.99**4 - 4 * 0.01 * 0.99**3)
    assert binomial_tail(5, 4, 0.5) == 0


def test_the_router_holds_the_canarys_breaker_against_its_stable() -> None:
    from serving.dataplane.app import Router

    router = Router.func_or_class()
    groups = {
        "stable": {"app": "acme.chat", "version": "v1", "local": True},
        "canary": {"app": "acme.chat.canary", "version": "v2", "local": True},
    }
    config = {"tenant": "7", "groups": groups, "canary_percent": 20, "breaker": {}}
    router.groups = groups
    router.breakers = router._breakers_for(config)
    stable, canary = router._breaker("stable"), router._breaker("canary")
    assert isinstance(canary, CanaryBreaker) and not isinstance(stable, CanaryBreaker)
    assert canary.baseline is stable and canary.share == pytest.approx(0.2)
    # A ramp keeps the breakers and their history; the share follows.
    canary.record(False)
    router.breakers = router._breakers_for(config | {"canary_percent": 50})
    assert router._breaker("canary") is canary and canary.share == pytest.approx(0.5)
    assert canary.failures == 1
    # Promoted: v2 is the stable now, a plain breaker.
    promoted = {"stable": {"app": "acme.chat.canary", "version": "v2", "local": True}}
    router.groups = promoted
    router.breakers = router._breakers_for(config | {"groups": promoted, "canary_percent": 0})
    assert type(router._breaker("stable")) is CircuitBreaker


def test_the_canarys_start_and_warm_up_are_not_slow() -> None:
    clock, stable, canary = _pair()
    _serve(clock, stable, [(True, 0.01)] * 100)
    # Four calls queued while Serve started the canary answer together, 3 s after they left.
    clock.now += 3.0
    for _ in range(4):
        canary.record(True, 3.0)
    assert canary.state == CLOSED
    # Then a cold engine: its first 20 answers are its warm-up.
    _serve(clock, canary, [(True, 0.01)] * 6 + [(True, 0.9)] * 10)
    assert canary.state == CLOSED
    # From then on a slow call is slow.
    _serve(clock, canary, [(True, 0.01)] * 10 + [(True, 0.5), (True, 0.01), (True, 0.5)])
    assert canary.state == OPEN


def test_a_canary_that_never_answered_yet_hands_its_calls_to_the_stable(tmp_path: Path) -> None:
    canary = StandInCanary()

    async def scenario(router: Any, post: Any, config: dict[str, Any]) -> None:
        router.handles["canary"] = ("acme.chat.canary", canary)  # reconfigure keeps it
        await router.reconfigure(config)
        breaker = router._breaker("canary")
        for _ in range(5):
            response = await post()
            assert response.status_code == 200 and response.headers["x-ab-group"] == "stable"
        assert canary.calls == 5 and breaker.failures == 0 and breaker.state == CLOSED
        # Failing every call past the start-up grace: broken, not starting (a crash loop).
        # Its failures are its own from then on, so its breaker can open and the portal see it.
        assert breaker.first_failure_at is not None
        breaker.first_failure_at -= STARTUP_GRACE_S
        response = await post()
        assert response.status_code == 502 and response.headers["x-ab-group"] == "canary"
        assert breaker.failures == 1
        # Once it has answered, its failures are its own too.
        breaker.first_failure_at, breaker.first_answer_at = None, 0.0
        response = await post()
        assert response.status_code == 502 and response.headers["x-ab-group"] == "canary"
        assert breaker.failures == 2

    with canary_router(tmp_path) as (router, post, config):
        asyncio.run(scenario(router, post, config))
