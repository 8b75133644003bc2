"""Hostile: a tenant whose canary fails on purpose (every few calls, or hangs) makes its
router mirror the canary's calls (serving.dataplane.mirror). The copies cost only the tenant's
own deployment: a bounded number in flight per router, and in a shared pool only a free slot
of the tenant's own share, never a queue for one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from serving.dataplane.breaker import CanaryBreaker
from serving.dataplane.mirror import MIRRORS_IN_FLIGHT
from tests.dataplane.canary_router import StandInCanary, run_ready, settle


def test_mirrors_in_flight_are_bounded_per_router(tmp_path: Path) -> None:
    """A canary that hangs holds at most MIRRORS_IN_FLIGHT copies; the clients are answered."""
    canary = StandInCanary(fail=False)

    async def scenario(router: Any, post: Any, breaker: CanaryBreaker) -> None:
        canary.release = asyncio.Event()
        breaker.record(False)
        responses = [await post() for _ in range(MIRRORS_IN_FLIGHT + 6)]
        assert {r.status_code for r in responses} == {200}
        assert {r.headers["x-ab-group"] for r in responses} == {"stable"}
        await asyncio.sleep(0)
        assert canary.most_in_flight == MIRRORS_IN_FLIGHT == len(router.mirrors.tasks)
        assert breaker.mirrored == MIRRORS_IN_FLIGHT + 6
        canary.release.set()
        await settle(router)
        assert canary.calls == MIRRORS_IN_FLIGHT and canary.in_flight == 0

    run_ready(tmp_path, canary, scenario)


def test_in_a_shared_pool_a_mirror_takes_only_a_free_slot_of_the_tenants_share(
    tmp_path: Path,
) -> None:
    canary = StandInCanary(fail=False)

    async def scenario(router: Any, post: Any, breaker: CanaryBreaker) -> None:
        router._pool_gate = gate = asyncio.Semaphore(1)  # the tenant's share: one slot
        await gate.acquire()  # held by one of its requests
        breaker.record(False)
        response = await post()
        assert response.status_code == 200 and response.headers["x-ab-group"] == "stable"
        assert breaker.mirrored == 1 and not router.mirrors.tasks and canary.calls == 0
        gate.release()
        await post()
        await settle(router)
        assert canary.calls == 1 and breaker.mirrored == 2 and not gate.locked()
        # The slot was free when the copy was planned, and a client's call took it before the
        # copy ran: the copy is dropped, it does not wait in line with the tenant's clients.
        task = asyncio.get_running_loop().create_task(router.mirrors._mirror(breaker, {}, gate))
        await gate.acquire()
        await asyncio.wait_for(task, timeout=5)  # (a copy waiting for the slot: TimeoutError)
        assert canary.calls == 1 and gate.locked()
        gate.release()

    run_ready(tmp_path, canary, scenario)
