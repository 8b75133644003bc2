"""The playground's bounds: the portal-wide limits a deployment's guard may lower, the member's
and the tenant's buckets, and the tenant's slots of runs in flight across web processes (each
run holds a web worker up to its timeout: a tenant's many accounts must not hold many)."""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from portal import ratelimit
from portal.exceptions import RateLimited
from serving.dataplane.guard import GuardConfig
from serving.deployments.models import Deployment
from tenants.models import Tenant

# Portal-wide bounds; a deployment's guard may only lower the first two.
DEFAULT_MAX_PROMPT_CHARS = 4000
DEFAULT_MAX_TOKENS = 256
DEFAULT_TIMEOUT_S = 15.0
DEFAULT_PER_MINUTE = 10  # playground runs per user and tenant ("both" is one run)
# A tenant's members together: each run holds a web worker up to the timeout, so many members
# of one tenant must not hold many workers at once (a hostile tenant's own accounts).
DEFAULT_TENANT_PER_MINUTE = 30
DEFAULT_TENANT_CONCURRENT = 2  # runs of one tenant in flight at once, across web processes


@dataclass(frozen=True)
class PlaygroundLimits:
    max_prompt_chars: int
    max_tokens: int
    timeout_s: float
    per_minute: int  # runs per member a minute
    tenant_per_minute: int  # runs per tenant a minute, all members together
    tenant_concurrent: int  # runs of the tenant in flight at once


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


def playground_limits(*, deployment: Deployment) -> PlaygroundLimits:
    """The portal's bounds, lowered by the deployment's guard where it is stricter: a prompt
    of at most max_prompt_tokens characters never exceeds that many tokens."""
    revision = deployment.current_revision
    guard = GuardConfig.from_dict(revision.guard if revision is not None else None)
    return PlaygroundLimits(
        max_prompt_chars=min(
            int(_setting("PLAYGROUND_MAX_PROMPT_CHARS", DEFAULT_MAX_PROMPT_CHARS)),
            guard.max_prompt_tokens,
        ),
        max_tokens=min(
            int(_setting("PLAYGROUND_MAX_TOKENS", DEFAULT_MAX_TOKENS)), guard.max_tokens
        ),
        timeout_s=float(_setting("PLAYGROUND_TIMEOUT_S", DEFAULT_TIMEOUT_S)),
        per_minute=int(_setting("PLAYGROUND_PER_MINUTE", DEFAULT_PER_MINUTE)),
        tenant_per_minute=int(_setting("PLAYGROUND_TENANT_PER_MINUTE", DEFAULT_TENANT_PER_MINUTE)),
        tenant_concurrent=max(
            1, int(_setting("PLAYGROUND_TENANT_CONCURRENT", DEFAULT_TENANT_CONCURRENT))
        ),
    )


def playground_throttle(*, tenant: Tenant, user_id: int, limits: PlaygroundLimits) -> float:
    """Charge one run to the user's bucket in this tenant and to the tenant's own bucket (all
    or none); seconds to wait, else 0."""
    user = ratelimit.Bucket(
        f"playground:{tenant.pk}:{user_id}", limits.per_minute / 60, burst=limits.per_minute
    )
    whole = ratelimit.Bucket(
        f"playground-tenant:{tenant.pk}",
        limits.tenant_per_minute / 60,
        burst=limits.tenant_per_minute,
    )
    return ratelimit.throttle([user, whole])


# KEYS: the tenant's set of runs in flight (token -> start, Redis ms). ARGV: token, cap, how
# long a run may hold its slot (ms). Returns {1, 0} admitted, or {0, ms until the oldest ends}.
_SLOT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - hold)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, math.max(0, tonumber(oldest[2]) + hold - now)}
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], hold)
return {1, 0}
"""


def _slots_key(tenant: Tenant) -> str:
    return f"{settings.RATE_LIMIT_KEY_PREFIX}:playground-running:{tenant.pk}"


@contextmanager
def playground_slot(*, tenant: Tenant, limits: PlaygroundLimits) -> Iterator[None]:
    """Hold one of the tenant's `tenant_concurrent` run slots (shared by every web process)
    while the body runs, or raise RateLimited. A slot its process never gave back (a killed
    worker) is free again once a run could no longer be answering (the timeout, plus slack)."""
    client = ratelimit.redis_client(settings.REDIS_URL)
    key = _slots_key(tenant)
    token = secrets.token_hex(8)
    hold_ms = int((limits.timeout_s + 10) * 1000)
    admitted, wait_ms = (
        int(v) for v in client.eval(_SLOT_LUA, 1, key, token, limits.tenant_concurrent, hold_ms)
    )
    if not admitted:
        wait = max(1, math.ceil(wait_ms / 1000))
        raise RateLimited(
            f"{limits.tenant_concurrent} playground run"
            f"{'s' if limits.tenant_concurrent != 1 else ''} of this tenant "
            f"{'are' if limits.tenant_concurrent != 1 else 'is'} already answering (at most "
            f"{limits.tenant_concurrent} at once per tenant); try again in {wait} s.",
            wait=wait,
        )
    try:
        yield
    finally:
        client.zrem(key, token)
