"""The health tick's Redis layout (`<prefix>:health:*`) and its reads: per-slot state, what
the last tick found per deployment, the tenants' feature reports, the tick lock, and the
ticks' durations (a cumulative histogram every process adds to and /metrics reads)."""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterator, Mapping
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
        # What the tick itself reads back of its last visit: "<checked_at> <probe_failures>"
        # (the full findings above are for pages; decoding them all was a tick's cost).
        "checked": f"{prefix}:health:checked",
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


def published_snapshots(found: Any, needle: bytes) -> Iterator[dict[str, Any]]:
    """The replica snapshots of one slot's SLI hash: `found` is the hash as read (raw JSON
    values) or the list the tick already decoded. A raw value without `needle` (a key the
    caller looks for) is skipped undecoded, and so is one that is not JSON."""
    for raw in found.values() if isinstance(found, Mapping) else found:
        if isinstance(raw, bytes | str):
            if needle not in (raw if isinstance(raw, bytes) else raw.encode()):
                continue
            try:
                raw = json.loads(raw)
            except ValueError:
                continue
        if isinstance(raw, dict):
            yield raw


def loads(raw: Any) -> Any:
    """The JSON value of a Redis field, None where the field is missing or empty."""
    return json.loads(raw) if raw else None


def checked_value(at: float, probe_failures: int) -> str:
    return f"{at!r} {int(probe_failures)}"


def last_checks(
    r: Any, keys: dict[str, str], ids: list[str], raws: list[Any]
) -> dict[int, dict[str, Any]]:
    """When the tick last checked each deployment and its failed probes in a row, from the
    small `checked` hash (`raws`, read in the tick's pipeline); a deployment missing there
    (new, or last checked before the hash existed) is looked up in its findings."""
    out: dict[int, dict[str, Any]] = {}
    missing: list[str] = []
    for pk, raw in zip(ids, raws, strict=False):
        at, _, failures = (raw.decode() if isinstance(raw, bytes) else raw or "").partition(" ")
        if at:
            out[int(pk)] = {"checked_at": float(at), "probe_failures": int(failures or 0)}
        else:
            missing.append(pk)
    if missing:
        for pk, found in zip(missing, r.hmget(keys["deployments"], missing), strict=True):
            info = loads(found) or {}
            out[int(pk)] = {k: info[k] for k in ("checked_at", "probe_failures") if k in info}
    return out


def deployment_health(deployment_id: int, redis_client: Any = None) -> dict[str, Any]:
    """What the last tick found for one deployment (pages, API)."""
    r = redis_client or health_redis()
    raw = r.hget(health_keys()["deployments"], str(deployment_id))
    return loads(raw) or {}


# Upper bounds (seconds) of the tick-duration histogram; one more bucket holds the rest.
TICK_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def tick_finish(
    r: Any,
    keys: dict[str, str],
    token: str,
    *,
    seconds: float,
    at: float,
    lock_key: str | None = None,
    shard: str = "0/1",
    deployments: int = 0,
) -> bool:
    """Count one (shard's) tick's duration into `tick_stats`, overall and for its shard, and
    release its lock if this tick still holds it (says whether it did): one pipelined round
    trip."""
    bucket = bisect.bisect_left(TICK_BUCKETS_S, seconds)  # `le`: a bound includes itself
    stats = keys["tick_stats"]
    with r.pipeline(transaction=False) as pipe:
        pipe.hincrby(stats, "count", 1)
        pipe.hincrbyfloat(stats, "sum", seconds)
        pipe.hincrby(stats, f"bucket:{bucket}", 1)
        pipe.hset(stats, mapping={"last": seconds, "last_at": at})
        pipe.hincrby(stats, f"shard:{shard}:count", 1)
        pipe.hincrbyfloat(stats, f"shard:{shard}:sum", seconds)
        pipe.hset(
            stats,
            mapping={
                f"shard:{shard}:last": seconds,
                f"shard:{shard}:last_at": at,
                f"shard:{shard}:deployments": deployments,
            },
        )
        pipe.eval(RELEASE_SCRIPT, 1, lock_key or keys["lock"], token)
        released = pipe.execute()[-1]
    return bool(released)


# Delete the lock only while this tick's token is in it (a tick that stalled past its lease
# must not free the lock of the tick that took over).
RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def tick_skipped(r: Any, keys: dict[str, str], shard: str = "0/1") -> None:
    """A tick that found another one running its shard (the lock held) and did nothing."""
    with r.pipeline(transaction=False) as pipe:
        pipe.hincrby(keys["tick_stats"], "skipped", 1)
        pipe.hincrby(keys["tick_stats"], f"shard:{shard}:skipped", 1)
        pipe.execute()


def tick_stats(redis_client: Any = None) -> dict[str, Any]:
    """The ticks' durations so far: count, sum (s), per-bucket counts (not cumulative, the
    last one above every bound), the last duration and when it ended, skipped ticks; with a
    sharded tick each shard's tick counts once, and `shards` has each shard's own count, sum,
    last duration, when it ended, its deployments and skipped ticks (`"<shard>/<shards>"`)."""
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
        "shards": _shard_stats(raw),
    }


def _shard_stats(raw: dict[str, str]) -> dict[str, dict[str, Any]]:
    shards: dict[str, dict[str, Any]] = {}
    for field, value in raw.items():
        if field.startswith("shard:"):
            label, _, name = field[len("shard:") :].rpartition(":")
            shards.setdefault(label, {})[name] = value
    return {
        label: {
            "count": int(found.get("count", 0)),
            "sum": float(found.get("sum", 0.0)),
            "last": float(found["last"]) if "last" in found else None,
            "last_at": float(found["last_at"]) if "last_at" in found else None,
            "deployments": int(found.get("deployments", 0)),
            "skipped": int(found.get("skipped", 0)),
        }
        for label, found in sorted(shards.items())
    }


def slot_hashes(
    r: Any, keys: Mapping[str, str], published: Mapping[Any, Any] | None, slots: list[Any]
) -> dict[tuple[str, str], Any]:
    """The SLI hashes of `slots` ((app, group) pairs): those the tick already read
    (`published`), the rest in one pipelined round trip."""
    read: dict[tuple[str, str], Any] = dict(published or {})
    missing = [slot for slot in dict.fromkeys(slots) if slot not in read]
    if missing:
        with r.pipeline(transaction=False) as pipe:
            for app, group in missing:
                pipe.hgetall(f"{keys['sli']}:{app}:{group}")
            read.update(zip(missing, pipe.execute(), strict=True))
    return read
