"""A canary its breaker shields is still rolled back: the requests the router turned away from
a version count as that version's failed requests in the health tick (its SLIs, its fast
rules), and under `errors_by_reason` as circuit_open."""

from __future__ import annotations

import json
from typing import Any


def test_requests_the_routers_turned_away_are_the_versions_failed_ones() -> None:
    from serving.ops.health import series as series_cache
    from serving.ops.health.signals import slot_signals
    from serving.slo.counts import Counts

    state: dict[str, Any] | None = None
    seen, points = [], []
    for tick in range(4):
        turned = 0 if tick < 2 else 6 * (tick - 1)  # its breaker opens after the second tick
        routers = [
            {"replica": "router-1", "breakers": {"canary": {"turned_away": turned, "trips": 1}}},
            {"replica": "router-2", "breakers": {"stable": {"turned_away": 50}}},  # not it
        ]
        delta = Counts(requests=3, errors=1, seconds=2.0)
        _, raw, point = slot_signals(
            now=1000.0 + 2 * tick, dep_id=1, tenant_id=1, group="canary", version="m:v2",
            replicas=[], delta=delta, routers=routers, gpu=[], consistency=None,
            reported={}, critical=None, state=state, series=[],
        )  # fmt: skip
        state = series_cache.decode_state(raw)
        seen.append((delta.requests, delta.errors))
        points += [json.loads(point)] if point is not None else []
    # The first sight of a router is its baseline; then 6 turned away a tick, each a failure.
    assert seen == [(3, 1), (3, 1), (9, 7), (9, 7)]
    assert points and points[0]["r"] == {"circuit_open": 6}  # and by reason
