"""The request gate: token-bucket rate limits per tenant and per API token, plus deny markers.

One Lua script in Redis checks an optional deny marker (a revoked token) and charges all
buckets of a request atomically: one round trip, no race between web processes.

Leases: for fast buckets (every bucket of the request at >= 2 / RATE_LIMIT_LEASE_FRACTION
requests per second, 200/s by default) one round trip takes up to
`rate * RATE_LIMIT_LEASE_FRACTION` tokens (at most RATE_LIMIT_LEASE_MAX) and the process spends
them locally for at most RATE_LIMIT_LEASE_MS. The limit is never exceeded (tokens are taken
from the shared bucket before they are spent); a process that does not spend its lease in
time returns nothing, so a tenant right at its limit may be under-admitted by up to
`FRACTION * 1000 / LEASE_MS` of its rate (10% by default) per mostly idle process. A deny
marker set by another process is seen at the next refill, within RATE_LIMIT_LEASE_MS; set in
this process it is seen at once. Slower buckets (the default quotas) stay strict: one round
trip per request.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings
from redis.exceptions import NoScriptError

# KEYS: bucket keys, then optionally the deny-marker key. ARGV: rate, capacity per bucket,
# then how many tokens the caller wants. Returns {granted, wait_ms}; {-1, 0} for the marker.
_LUA = """
local n = (#ARGV - 1) / 2
local want = tonumber(ARGV[#ARGV])
if #KEYS > n and redis.call('EXISTS', KEYS[#KEYS]) == 1 then
  return {-1, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait = 0
local grant = want
local levels = {}
for i = 1, n do
  local rate = tonumber(ARGV[2 * i - 1])
  local cap = tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(state[1]) or cap
  local ts = tonumber(state[2]) or now
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate / 1000)
  levels[i] = tokens
  if tokens < 1 then
    local need = math.ceil((1 - tokens) * 1000 / rate)
    if need > wait then wait = need end
  end
  grant = math.min(grant, math.floor(tokens))
end
if wait > 0 then grant = 0 end
for i = 1, n do
  local rate = tonumber(ARGV[2 * i - 1])
  local cap = tonumber(ARGV[2 * i])
  local tokens = levels[i] - grant
  redis.call('HSET', KEYS[i], 'tokens', tostring(tokens), 'ts', now)
  redis.call('PEXPIRE', KEYS[i], math.ceil(cap * 1000 / rate) + 1000)
end
return {grant, wait}
"""


@dataclass(frozen=True)
class Bucket:
    key: str
    rate_per_second: float
    # Requests allowed in a burst; None: RATE_LIMIT_BURST_SECONDS of the rate. Throttles set it
    # (10 logins per 5 minutes is a rate of 1/30 s with a burst of 10).
    burst: float | None = None

    @property
    def capacity(self) -> float:
        if self.burst is not None:
            return max(1.0, self.burst)
        return max(1.0, self.rate_per_second * settings.RATE_LIMIT_BURST_SECONDS)


@lru_cache(maxsize=4)
def redis_client(url: str) -> Any:
    """One client (connection pool) per Redis URL for this process."""
    import redis

    return redis.Redis.from_url(url)


@lru_cache(maxsize=4)
def _redis_script(url: str) -> Any:
    return redis_client(url).register_script(_LUA)


class Denied(Exception):
    """The request carries something marked as denied (e.g. a revoked token)."""


_local_lock = threading.Lock()
_local_markers: dict[str, float] = {}
# Values published with set_value(): Redis is the truth; _value_memo keeps its young replies
# (name -> (monotonic expiry, value)).
_value_memo: dict[str, tuple[float, str | None]] = {}


def _key(name: str) -> str:
    return f"{settings.RATE_LIMIT_KEY_PREFIX}:{name}"


def rates_are_leased(*rates: float | None) -> bool:
    """Whether a request charging buckets of these rates is served from leases (see above)."""
    known = [float(r) for r in rates if r]
    return len(known) == len(rates) and lease_size([Bucket("", r) for r in known]) > 1


def lease_size(buckets: list[Bucket]) -> int:
    """Tokens one Redis round trip takes for this set of buckets (1 = strict, no lease)."""
    if not buckets:
        return 1
    slowest = min(b.rate_per_second for b in buckets)
    size = int(slowest * settings.RATE_LIMIT_LEASE_FRACTION)
    return max(1, min(settings.RATE_LIMIT_LEASE_MAX, size))


# Leases held by this process: tuple of Redis keys -> [tokens left, monotonic expiry].
_leases: dict[tuple[str, ...], list[float]] = {}


def _take_leased(lease_key: tuple[str, ...], now: float) -> bool:
    with _local_lock:
        lease = _leases.get(lease_key)
        if lease is None:
            return False
        if lease[0] < 1 or lease[1] <= now:
            del _leases[lease_key]
            return False
        lease[0] -= 1
        return True


def consume(buckets: list[Bucket], *, deny_marker: str | None = None) -> float:
    """Charge one request to every bucket, or to none. Returns 0, or seconds to wait.

    Raises Denied when `deny_marker` is set (checked in the same atomic step).
    """
    buckets = [b for b in buckets if b.rate_per_second > 0]
    now = time.monotonic()
    if deny_marker is not None and _local_markers.get(deny_marker, 0.0) > now:
        raise Denied(deny_marker)
    keys = [_key(b.key) for b in buckets]
    if deny_marker is not None:
        keys.append(_key(deny_marker))
    if not keys:
        return 0.0
    want = lease_size(buckets)
    lease_key = tuple(keys)
    if want > 1 and _take_leased(lease_key, now):
        return 0.0
    args: list[float] = []
    for bucket in buckets:
        args.extend([bucket.rate_per_second, bucket.capacity])
    args.append(want)
    granted, wait_ms = (int(v) for v in _redis_script(settings.REDIS_URL)(keys=keys, args=args))
    if granted < 0:
        raise Denied(deny_marker)
    if granted == 0:
        return math.ceil(wait_ms) / 1000.0
    if granted > 1:
        with _local_lock:
            expires = time.monotonic() + settings.RATE_LIMIT_LEASE_MS / 1000.0
            _leases[lease_key] = [float(granted - 1), expires]
    return 0.0


class Charge:
    """A charge sent to Redis whose reply is read later: `charge_start()` writes the script call
    and returns at once, the caller does its own work (building a query) while Redis answers,
    and `result()` reads the verdict (what `consume` returns or raises). Nothing is admitted
    before `result()`; a charge that is never read is dropped with its connection."""

    __slots__ = ("_conn", "_buckets", "_marker", "_done", "_wait", "_denied")

    def __init__(self, *, wait: float = 0.0, denied: str | None = None) -> None:
        self._conn: Any = None
        self._buckets: list[Bucket] = []
        self._marker = denied
        self._done = True
        self._wait = wait
        self._denied = denied is not None

    @property
    def pending(self) -> bool:
        return not self._done

    def result(self) -> float:
        if not self._done:
            self._read()
        if self._denied:
            raise Denied(self._marker)
        return self._wait

    def _read(self) -> None:
        conn, self._conn, self._done = self._conn, None, True
        pool = redis_client(settings.REDIS_URL).connection_pool
        try:
            reply = conn.read_response()
        except NoScriptError:  # Redis restarted and forgot the script; the connection is fine
            pool.release(conn)
            _script_loaded.clear()
            try:
                self._wait = consume(self._buckets, deny_marker=self._marker)
            except Denied:
                self._denied = True
            return
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        pool.release(conn)
        granted, wait_ms = (int(v) for v in reply)
        self._denied = granted < 0
        self._wait = math.ceil(wait_ms) / 1000.0 if granted == 0 else 0.0

    def drop(self) -> None:
        """Forget an unread charge (its request failed before `result()`): the connection is
        closed, so no later command reads this reply. The bucket stays charged."""
        if self._done:
            return
        conn, self._conn, self._done = self._conn, None, True
        conn.disconnect()
        redis_client(settings.REDIS_URL).connection_pool.release(conn)


def charge_start(buckets: list[Bucket], *, deny_marker: str | None = None) -> Charge:
    """`consume`, split in two for strict (unleased) charges: send now, read with `result()`.

    Leased and local answers (a marker set in this process, no buckets) come back settled; so
    does a charge whose script is not loaded in Redis yet (sent through `consume`).
    """
    buckets = [b for b in buckets if b.rate_per_second > 0]
    if deny_marker is not None and _local_markers.get(deny_marker, 0.0) > time.monotonic():
        return Charge(denied=deny_marker)
    if not buckets or lease_size(buckets) > 1:
        try:
            return Charge(wait=consume(buckets, deny_marker=deny_marker))
        except Denied:
            return Charge(denied=deny_marker)
    script = _redis_script(settings.REDIS_URL)
    if not _script_loaded.get(script.sha):
        try:
            wait = consume(buckets, deny_marker=deny_marker)  # EVALSHA, loading it on NOSCRIPT
        except Denied:
            return Charge(denied=deny_marker)
        _script_loaded[script.sha] = True
        return Charge(wait=wait)
    keys = [_key(b.key) for b in buckets]
    if deny_marker is not None:
        keys.append(_key(deny_marker))
    args: list[Any] = []
    for bucket in buckets:
        args.extend([bucket.rate_per_second, bucket.capacity])
    args.append(1)
    pool = redis_client(settings.REDIS_URL).connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
    except BaseException:
        conn.disconnect()
        pool.release(conn)
        raise
    charge = Charge()
    charge._conn, charge._buckets, charge._marker, charge._done = conn, buckets, deny_marker, False
    return charge


# Script digests this process has seen Redis run (a restarted Redis forgets them: the first
# charge after that answers NOSCRIPT at `result()`, which clears this and charges again).
_script_loaded: dict[str, bool] = {}


def set_marker(name: str, ttl_s: int) -> None:
    """Mark `name` as denied for `ttl_s` seconds, for every web process at once."""
    ttl_s = max(1, ttl_s)
    with _local_lock:
        now = time.monotonic()
        for stale in [k for k, until in _local_markers.items() if until <= now]:
            del _local_markers[stale]
        _local_markers[name] = now + ttl_s
        marker_key = _key(name)
        for lease_key in [k for k in _leases if k[-1] == marker_key]:
            del _leases[lease_key]
    redis_client(settings.REDIS_URL).set(_key(name), "1", ex=ttl_s)


def throttle(buckets: list[Bucket]) -> float:
    """Charge one attempt to every bucket (all or none); seconds to wait, or 0. A throttle is a
    bucket with an explicit burst: `Bucket("login-ip:<ip>", 50 / 300, burst=50)`."""
    return consume(buckets)


def set_value(name: str, value: str, ttl_s: int) -> None:
    """Publish `value` under `name` for `ttl_s` seconds, for every web process at once."""
    ttl_s = max(1, ttl_s)
    redis_client(settings.REDIS_URL).set(_key(name), value, ex=ttl_s)
    with _local_lock:
        _value_memo.pop(name, None)


def get_value(name: str, *, memo_ms: int = 0) -> str | None:
    """The value published under `name`, or None. One GET, unless `memo_ms` > 0 lets this
    process reuse a reply that young (the lease bound: a change made in another process is seen
    within memo_ms; made in this one, at once)."""
    now = time.monotonic()
    with _local_lock:
        memo = _value_memo.get(name)
        if memo is not None and memo[0] > now:
            return memo[1]
    raw = redis_client(settings.REDIS_URL).get(_key(name))
    value = raw.decode() if isinstance(raw, bytes) else raw
    if memo_ms > 0:
        with _local_lock:
            if len(_value_memo) > 10_000:
                _value_memo.clear()
            _value_memo[name] = (now + memo_ms / 1000.0, value)
    return value
