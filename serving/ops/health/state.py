"""The health tick's Redis layout (`<prefix>:health:*`) and its reads: per-slot state, what
the last tick found per deployment, the tenants' feature reports, the tick lock, and the
ticks' durations (a cumulative histogram every process adds to and /metrics reads)."""

from __future__ import annotations

import bisect
import json
from typing import Any

from django.conf import settings


def health_redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def health_keys() -> dict[str, str]:
    prefix = settings.SLI_KEY_PREFIX
    return {
        "state": f"{prefix}:health:state",
        "deployments": f"{prefix}:health:deployments",
        "features": f"{prefix}:health:features",
        "lock": f"{prefix}:health:tick-lock",
        "tick_stats": f"{prefix}:health:tick-stats",
        "sli": f"{prefix}:sli",
        "consistency": consistency_key(),
        "signals": f"{prefix}:health:signals",  # per slot: small state (+ ":<slot>": series)
        "router": f"{prefix}:router",  # + ":<app>": the routers' breakers (dataplane.router)
        # The GPU agents' newest samples; the same key as serving.telemetry.keys' "latest"
        # (ops may not import telemetry; a test keeps the two equal).
        "gpu_latest": f"{prefix}:gpu:latest",
    }


def consistency_key() -> str:
    """The Redis hash the golden-prompt probe writes and the health tick reads: field
    `consistency_field(deployment_id, group)`, value JSON `{"score": float in [0, 1],
    "at": unix_ts, "detail": str}` (the `output_consistency` SLI)."""
    return f"{settings.SLI_KEY_PREFIX}:consistency"


def consistency_field(deployment_id: int, group: str) -> str:
    return f"{deployment_id}:{group}"


def loads(raw: Any) -> Any:
    """The JSON value of a Redis field, None where the field is missing or empty."""
    return json.loads(raw) if raw else None


def deployment_health(deployment_id: int, redis_client: Any = None) -> dict[str, Any]:
    """What the last tick found for one deployment (pages, API)."""
    r = redis_client or health_redis()
    raw = r.hget(health_keys()["deployments"], str(deployment_id))
    return loads(raw) or {}


# Upper bounds (seconds) of the tick-duration histogram; one more bucket holds the rest.
TICK_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def tick_finish(r: Any, keys: dict[str, str], token: str, *, seconds: float, at: float) -> bool:
    """Count one tick's duration into `tick_stats` and say whether this tick still holds the
    lock: one pipelined round trip, the one the lock's release check took before."""
    bucket = bisect.bisect_left(TICK_BUCKETS_S, seconds)  # `le`: a bound includes itself
    with r.pipeline(transaction=False) as pipe:
        pipe.hincrby(keys["tick_stats"], "count", 1)
        pipe.hincrbyfloat(keys["tick_stats"], "sum", seconds)
        pipe.hincrby(keys["tick_stats"], f"bucket:{bucket}", 1)
        pipe.hset(keys["tick_stats"], mapping={"last": seconds, "last_at": at})
        pipe.get(keys["lock"])
        held = pipe.execute()[-1]
    return bool(held == token.encode())


def tick_skipped(r: Any, keys: dict[str, str]) -> None:
    """A tick that found another one running (the lock held) and did nothing."""
    r.hincrby(keys["tick_stats"], "skipped", 1)


def tick_stats(redis_client: Any = None) -> dict[str, Any]:
    """The ticks' durations so far: count, sum (s), per-bucket counts (not cumulative, the
    last one above every bound), the last duration and when it ended, skipped ticks."""
    r = redis_client or health_redis()
    try:
        raw = {k.decode(): v.decode() for k, v in r.hgetall(health_keys()["tick_stats"]).items()}
    finally:
        if redis_client is None:
            r.close()
    buckets = [int(raw.get(f"bucket:{i}", 0)) for i in range(len(TICK_BUCKETS_S) + 1)]
    return {
        "count": int(raw.get("count", 0)),
        "sum": float(raw.get("sum", 0.0)),
        "buckets": buckets,
        "last": float(raw["last"]) if "last" in raw else None,
        "last_at": float(raw["last_at"]) if "last_at" in raw else None,
        "skipped": int(raw.get("skipped", 0)),
    }
