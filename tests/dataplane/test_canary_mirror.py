"""A suspect canary (serving.dataplane.mirror): after one failed canary call its clients are
answered by the stable while copies of their calls go to the canary; the copies' outcomes
decide, through the canary's breaker, whether the clients come back or the breaker opens."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from serving.dataplane.breaker import (
    CLOSED,
    OPEN,
    OWED_CAP,
    BreakerConfig,
    CanaryBreaker,
    CircuitBreaker,
)
from tests.dataplane.canary_router import StandInCanary, run_ready, settle

K = BreakerConfig().mirror_clean  # clean calls owed per failure


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pair(**config: float) -> tuple[Clock, CircuitBreaker, CanaryBreaker]:
    clock, settings = Clock(), BreakerConfig.from_dict(config)
    stable = CircuitBreaker(settings, clock)
    return clock, stable, CanaryBreaker(settings, clock, baseline=stable, share=0.2)


def test_one_failure_makes_the_canary_suspect_until_it_answers_mirror_clean_calls() -> None:
    clock, stable, canary = _pair()
    for _ in range(40):  # past its warm-up, beside a clean stable
        clock.now += 0.05
        stable.record(True, 0.01)
        canary.record(True, 0.01)
    assert not canary.suspect()
    canary.record(False)
    assert canary.suspect() and canary.state == CLOSED  # one failure: suspect, not open
    clock.now += 10.0
    canary.record(True, 5.0)  # a slow answer is not a clean one
    for _ in range(K - 1):
        canary.record(True, 0.01)
    assert canary.suspect()
    canary.record(True, 0.01)
    assert not canary.suspect() and canary.snapshot()["suspect"] is False
    # Each failure adds mirror_clean owed calls: failing 1 call in 3 keeps it suspect.
    for i in range(60):
        canary.record(i % 3 != 0, 0.01)
    assert canary.suspect() and OWED_CAP * K - 3 < canary.clean_owed <= OWED_CAP * K  # capped
    assert canary.state == CLOSED
    while canary.suspect():
        canary.record(True, 0.01)
    # Failures close together open it: an open canary is not "suspect", it is left.
    for _ in range(3):
        canary.record(False)
    assert canary.state == OPEN and not canary.suspect()


def test_no_mirroring_at_mirror_clean_zero_beside_a_flaky_or_an_open_stable() -> None:
    _, _, off = _pair(mirror_clean=0)
    off.record(False)
    assert not off.suspect()
    clock, flaky, canary = _pair()
    for i in range(100):  # a stable failing 1 call in 10: one canary failure is no news
        clock.now += 0.05
        flaky.record(i % 10 != 0, 0.01)
    canary.record(False)
    assert not canary.suspect() and canary.state == CLOSED
    _, stable, canary = _pair()
    canary.record(False)
    stable.state = OPEN
    assert not canary.suspect()  # the stable is no better place for its clients


def test_a_failing_canarys_clients_leave_at_its_first_failure(tmp_path: Path) -> None:
    canary = StandInCanary(fail=True)

    async def scenario(router: Any, post: Any, breaker: CanaryBreaker) -> None:
        response = await post()  # the fault's onset: the client sees the canary fail
        assert response.status_code == 502 and response.headers["x-ab-group"] == "canary"
        assert breaker.suspect()
        groups = []
        while breaker.state == CLOSED and len(groups) < 10:
            response = await post()
            groups.append((response.status_code, response.headers["x-ab-group"]))
            await settle(router)
        # Every later client got the stable's answer; the canary got each call's copy, whose
        # failures opened its breaker (the portal rolls it back on what the health tick sees).
        assert groups == [(200, "stable")] * len(groups)
        assert canary.calls == 1 + breaker.mirrored == 1 + len(groups)
        assert breaker.state == OPEN and breaker.failures == canary.calls and breaker.trips == 1
        assert router.stats()["breakers"]["canary"]["mirrored"] == breaker.mirrored

    run_ready(tmp_path, canary, scenario)


def test_a_clean_canary_gets_its_clients_back_after_its_mirrors_answer(tmp_path: Path) -> None:
    canary = StandInCanary(fail=False)

    async def scenario(router: Any, post: Any, breaker: CanaryBreaker) -> None:
        breaker.record(False)  # a rare failure of a clean canary
        assert breaker.suspect()
        groups = []
        for _ in range(K + 2):
            response = await post()
            groups.append(response.headers["x-ab-group"])
            await settle(router)
        assert groups == ["stable"] * K + ["canary"] * 2
        assert breaker.state == CLOSED and breaker.mirrored == K and canary.calls == K + 2

    run_ready(tmp_path, canary, scenario)


def test_a_versions_failure_is_published_within_soon_s_not_at_the_next_second() -> None:
    """The health tick reads the replicas' windows from Redis: a failure asks for a publish
    SOON_S after the last one instead of a second after it (at most 1/SOON_S a second)."""
    from serving.dataplane.publisher import SOON_S, Publisher

    async def scenario() -> list[float]:
        times: list[float] = []

        async def write(client: Any, prefix: str, snapshot: dict[str, Any]) -> None:
            times.append(loop.time())

        loop = asyncio.get_running_loop()
        publisher = Publisher(dict, write)
        publisher.configure({"redis_url": "redis://127.0.0.1:1/0"})  # never connected
        started = loop.time()
        await asyncio.sleep(0.05)
        for _ in range(20):  # a burst of failures: one early publish
            publisher.soon()
        await asyncio.sleep(0.8)  # before the regular publish (1 s) would have come
        publisher.stop()
        return [t - started for t in times]

    times = asyncio.run(scenario())
    assert len(times) == 1 and SOON_S - 0.01 <= times[0] < 0.85, times
