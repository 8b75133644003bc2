"""Token-bucket rate limits per tenant and per API token.

With Redis configured, all buckets of one request are checked and charged atomically in a
single Lua script (no race between two web processes). Embedded mode (no Redis) uses the same
algorithm behind a process-wide lock, which is atomic for the single web process it runs.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings

_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait = 0
local levels = {}
for i = 1, #KEYS do
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
end
for i = 1, #KEYS do
  local rate = tonumber(ARGV[2 * i - 1])
  local cap = tonumber(ARGV[2 * i])
  local tokens = levels[i]
  if wait == 0 then tokens = tokens - 1 end
  redis.call('HSET', KEYS[i], 'tokens', tostring(tokens), 'ts', now)
  redis.call('PEXPIRE', KEYS[i], math.ceil(cap * 1000 / rate) + 1000)
end
return wait
"""


@dataclass(frozen=True)
class Bucket:
    key: str
    rate_per_second: float

    @property
    def capacity(self) -> float:
        return max(1.0, self.rate_per_second * settings.RATE_LIMIT_BURST_SECONDS)


@lru_cache(maxsize=1)
def _redis_script() -> Any:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    return client.register_script(_LUA)


_local_lock = threading.Lock()
_local_state: dict[str, tuple[float, float]] = {}


def _consume_local(buckets: list[Bucket]) -> float:
    now = time.monotonic()
    with _local_lock:
        levels = []
        wait = 0.0
        for bucket in buckets:
            tokens, ts = _local_state.get(bucket.key, (bucket.capacity, now))
            tokens = min(bucket.capacity, tokens + (now - ts) * bucket.rate_per_second)
            levels.append(tokens)
            if tokens < 1:
                wait = max(wait, (1 - tokens) / bucket.rate_per_second)
        for bucket, tokens in zip(buckets, levels, strict=True):
            _local_state[bucket.key] = (tokens - 1 if wait == 0 else tokens, now)
        return wait


def consume(buckets: list[Bucket]) -> float:
    """Charge one request to every bucket, or to none. Returns 0, or seconds to wait."""
    buckets = [b for b in buckets if b.rate_per_second > 0]
    if not buckets:
        return 0.0
    if not settings.REDIS_URL:
        return _consume_local(buckets)
    keys = [f"{settings.RATE_LIMIT_KEY_PREFIX}:{b.key}" for b in buckets]
    args: list[float] = []
    for bucket in buckets:
        args.extend([bucket.rate_per_second, bucket.capacity])
    wait_ms = int(_redis_script()(keys=keys, args=args))
    return math.ceil(wait_ms) / 1000.0
