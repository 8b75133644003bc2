"""SLI windows kept by every replica and published to Redis once a second.

A window counts requests, errors, tokens and histograms of latency, time to first token and
inter-token latency (fixed bucket bounds in ms, so windows of replicas add up exactly).
Published as one JSON value per replica in the hash `<prefix>:sli:<app>:<group>`, which the
portal's health check reads for every deployment in one pipelined round trip. Each value also
carries the replica's cumulative `totals` since it started (counters, like Prometheus'): the
health check takes their deltas, so it loses nothing whatever its own interval. Its
`signals` (serving.dataplane.signals) add failures by reason, queue wait, requests in flight
and the weights' fingerprint.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from serving.dataplane.identity import process_identity
from serving.dataplane.signals import ReplicaSignals, request_failure

BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)  # + overflow bucket


def _histogram() -> list[int]:
    return [0] * (len(BOUNDS_MS) + 1)


def _observe(histogram: list[int], seconds: float) -> None:
    histogram[bisect.bisect_left(BOUNDS_MS, seconds * 1000.0)] += 1


def quantile(histogram: list[int], q: float) -> float | None:
    """Upper bound (ms) of the bucket holding quantile q; None for an empty histogram."""
    total = sum(histogram)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(histogram):
        seen += count
        if seen >= rank and count:
            return float(BOUNDS_MS[index]) if index < len(BOUNDS_MS) else float("inf")
    return float("inf")


@dataclass
class SliWindow:
    started: float = field(default_factory=time.time)
    requests: int = 0
    errors: int = 0  # the version's fault (5xx, engine failures)
    rejected: int = 0  # the client's fault (4xx)
    tokens_in: int = 0
    tokens_out: int = 0
    latency: list[int] = field(default_factory=_histogram)
    ttft: list[int] = field(default_factory=_histogram)
    itl: list[int] = field(default_factory=_histogram)

    def record(
        self,
        *,
        latency_s: float,
        ok: bool,
        client_error: bool = False,
        ttft_s: float | None = None,
        itl_s: list[float] | None = None,
        tokens_in: int = 0,
        tokens_out: int = 0,
    ) -> None:
        self.requests += 1
        if client_error:
            self.rejected += 1
        elif not ok:
            self.errors += 1
        _observe(self.latency, latency_s)
        if ttft_s is not None:
            _observe(self.ttft, ttft_s)
        for gap in itl_s or ():
            _observe(self.itl, gap)
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out

    def merge(self, other: SliWindow) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.rejected += other.rejected
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        for mine, theirs in (
            (self.latency, other.latency),
            (self.ttft, other.ttft),
            (self.itl, other.itl),
        ):
            for index, count in enumerate(theirs):
                mine[index] += count

    def as_dict(self, ended: float | None = None) -> dict[str, Any]:
        ended = ended or time.time()
        return {
            "start": round(self.started, 3),
            "end": round(ended, 3),
            "requests": self.requests,
            "errors": self.errors,
            "rejected": self.rejected,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "latency_ms": self.latency,
            "ttft_ms": self.ttft,
            "itl_ms": self.itl,
            "bounds_ms": list(BOUNDS_MS),
        }


class SliRecorder:
    """The current window, the last closed one and the cumulative totals since the replica
    started; `roll()` closes the current window into the totals."""

    def __init__(
        self, app: str, group: str, version: str, replica: str, engine: dict[str, Any] | None = None
    ) -> None:
        self.app, self.group, self.version, self.replica = app, group, version, replica
        self.engine = engine or {}  # the engine's options (its batch size)
        self.node = ray_node_id()
        self.current = SliWindow()
        self.totals = SliWindow()
        self.signals = ReplicaSignals()  # failures by reason, queue wait
        self.last: dict[str, Any] | None = None

    def record(self, *, queued_s: float | None = None, **window: Any) -> None:
        """Count one ended request in the current window, and its queue wait and failure
        reason in the signals. Called from the request's `finally`: what failed it (a
        refusal, an engine error) is the exception in flight."""
        self.current.record(**window)
        reason = None
        if not window.get("ok"):
            reason = request_failure(sys.exc_info()[1], bool(window.get("client_error")))
        self.signals.ended(queued_s=queued_s, reason=reason)

    def roll(
        self, kv: dict[str, Any] | None = None, loaded: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        now = time.time()
        window = self.current.as_dict(now)
        self.totals.merge(self.current)
        self.current = SliWindow(started=now)
        self.last = {
            "app": self.app,
            "group": self.group,
            "version": self.version,
            "replica": self.replica,
            "pid": os.getpid(),
            "node": self.node,  # the Ray node: pids are matched on their own node
            # The pid namespace and GPUs: a container's pid still maps to NVML's (identity).
            **process_identity(),
            "window": window,
            "totals": self.totals.as_dict(now),
            "kv": kv or {},
            "signals": self.signals.as_dict(loaded or {}, self.engine),
        }
        return self.last


def ray_node_id() -> str | None:
    """The Ray node this process runs on; None outside a Ray worker (tests, the portal)."""
    try:
        import ray
    except ImportError:
        return None
    try:
        return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else None
    except Exception:  # an odd runtime context: no node, pids are matched as before
        return None


def sli_key(prefix: str, app: str, group: str) -> str:
    return f"{prefix}:sli:{app}:{group}"


def stopped_key(prefix: str, app: str, group: str) -> str:
    """Replicas of the slot that Serve stopped on purpose (a scale-down, a rollout, a delete):
    field replica id, value `{"version", "totals", "at"}`, their last counts. A replica whose
    value went stale without an entry here did not stop on purpose: the health check counts it
    lost (`replica_restarts`). Not under `<prefix>:sli:`, which readers scan for windows."""
    return f"{prefix}:sli-stopped:{app}:{group}"


STOPPED_TTL_S = 330  # over the longest health interval (300 s): every tick sees a goodbye


# A stop, atomic: the replica's value leaves the slot's hash only while it is this recorder's
# own (ARGV[2], its totals' start; "" keeps the value: a kill's mark, written before the kill),
# the stopped entry is written, and entries stopped over STOPPED_TTL_S ago leave (a slot that
# stops a replica every few minutes keeps its stopped hash small).
STOP_SCRIPT = """
if ARGV[2] ~= '' then
  local value = redis.call('HGET', KEYS[1], ARGV[1])
  if value then
    local ok, snapshot = pcall(cjson.decode, value)
    local start = ok and type(snapshot) == 'table' and type(snapshot['totals']) == 'table'
      and tonumber(snapshot['totals']['start'])
    if start and math.abs(start - tonumber(ARGV[2])) < 0.0005 then
      redis.call('HDEL', KEYS[1], ARGV[1])
    end
  end
end
local old = redis.call('HGETALL', KEYS[2])
for i = 1, #old, 2 do
  local ok, entry = pcall(cjson.decode, old[i + 1])
  local at = ok and type(entry) == 'table' and tonumber(entry['at'])
  if not at or at < tonumber(ARGV[5]) - tonumber(ARGV[4]) then
    redis.call('HDEL', KEYS[2], old[i])
  end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return redis.call('EXPIRE', KEYS[2], ARGV[4])
"""


def mark_stopped(
    client: Any,
    prefix: str,
    app: str,
    group: str,
    replica: str,
    last: dict[str, Any],
    *,
    own_start: float | None = None,
) -> None:
    """Record the replica as stopped on purpose (`last`: at least `at`, the time after which
    a value published under its id is a live replica's); with `own_start`, its value leaves
    the slot's hash too while it is still that recorder's."""
    client.eval(
        STOP_SCRIPT,
        2,
        sli_key(prefix, app, group),
        stopped_key(prefix, app, group),
        replica,
        "" if own_start is None else repr(round(own_start, 3)),
        json.dumps(last, separators=(",", ":")),
        STOPPED_TTL_S,
        repr(time.time()),
    )


def farewell(redis_url: str, prefix: str, recorder: SliRecorder) -> None:
    """A replica Serve stops gracefully says so (from `__del__`, which Serve calls then; a
    crash never runs it): its value leaves the slot's hash and its last totals go to the
    stopped hash, in one script. Synchronous (`__del__` may not await), one try with 1 s
    timeouts (it runs on the replica's event loop). Never raises."""
    client = None
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        now = time.time()
        final = SliWindow(started=recorder.totals.started)  # the totals, open window in
        final.merge(recorder.totals)
        final.merge(recorder.current)
        last = {"version": recorder.version, "totals": final.as_dict(now), "at": now}
        client = redis.Redis.from_url(
            redis_url, socket_timeout=1.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0)
        )
        app, group, replica = recorder.app, recorder.group, recorder.replica
        mark_stopped(client, prefix, app, group, replica, last, own_start=recorder.totals.started)
    except Exception as exc:  # a goodbye that failed reads as a lost replica: no worse
        replica = getattr(recorder, "replica", "?")
        print(f"replica {replica}: stop not recorded ({exc})", file=sys.stderr)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


async def publish(redis: Any, prefix: str, snapshot: dict[str, Any], ttl_s: int = 10) -> None:
    key = sli_key(prefix, snapshot["app"], snapshot["group"])
    payload = json.dumps(snapshot, separators=(",", ":"))
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hset(key, snapshot["replica"], payload)
        pipe.expire(key, ttl_s)
        pipe.publish(f"{prefix}:sli", payload)
        await pipe.execute()
