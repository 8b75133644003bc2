"""A drill's sample of the tenant's own prompts, recorded at the router only while a drill run
armed it (incidents.drills.replay) and kept in Redis with a TTL.

The portal arms a deployment by writing `<prefix>:prompt-sample:arm:<tenant>:<deployment>` (the
run, when recording stops, how long the sample is kept, the limits, the hashes of the portal's
own keys) with a TTL. While armed, the
router appends each prompt of its own tenant's clients (never the portal's probe and drill
traffic, never a drill's synthetic identity) to `<prefix>:prompt-sample:data:<tenant>:<run>`,
where `<tenant>` is the router's own, from its config: a router can write no other tenant's
sample. Bounded in count, bytes per prompt (cut at a character boundary) and total bytes, by
one atomic script that appends only while the arm record is still the run's; the portal deletes
both keys when the run ends (arm record first), the TTL if it never does.
Recording never delays or fails a request: it runs in its own task and gives up on any error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from serving.dataplane.keys import hash_key
from serving.dataplane.publisher import Publisher

logger = logging.getLogger("ray.serve")

# Hard ceilings, whatever an arm record asks for.
MAX_PROMPTS = 64
MAX_PROMPT_BYTES = 4096
MAX_TOTAL_BYTES = 128 * 1024
ARM_CHECK_S = 1.0  # how stale the router's view of the arm record may be
MAX_PENDING = 16  # recordings in flight at once; more are dropped, never queued

# KEYS: the sample list, its byte counter, the arm record. ARGV: prompt, max count, max total
# bytes, TTL (ms), run. Appends only while the arm record is still this run's: once the portal
# deletes it (the run ended), a router whose cached view is a second stale cannot bring the
# sample back.
APPEND = """
local arm = redis.call('GET', KEYS[3])
if not arm then return 0 end
local ok, record = pcall(cjson.decode, arm)
if not ok or type(record) ~= 'table' or tonumber(record['run']) ~= tonumber(ARGV[5]) then
  return 0
end
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
if used + string.len(ARGV[1]) > tonumber(ARGV[3]) then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('INCRBY', KEYS[2], string.len(ARGV[1]))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""


def arm_key(prefix: str, tenant: Any, deployment: str) -> str:
    return f"{prefix}:prompt-sample:arm:{tenant}:{deployment}"


def sample_key(prefix: str, tenant: Any, run: Any) -> str:
    return f"{prefix}:prompt-sample:data:{tenant}:{run}"


def bytes_key(prefix: str, tenant: Any, run: Any) -> str:
    return sample_key(prefix, tenant, run) + ":bytes"


def clip(prompt: str, limit: int) -> bytes:
    """At most `limit` bytes of UTF-8, never half a character."""
    return prompt.encode("utf-8")[:limit].decode("utf-8", "ignore").encode("utf-8")


def limits(arm: dict[str, Any]) -> tuple[int, int, int]:
    """(prompts, bytes per prompt, total bytes): the arm's, under the hard ceilings."""

    def bounded(name: str, ceiling: int) -> int:
        value = arm.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return ceiling
        return min(value, ceiling)

    return (
        bounded("max_prompts", MAX_PROMPTS),
        bounded("max_prompt_bytes", MAX_PROMPT_BYTES),
        bounded("max_total_bytes", MAX_TOTAL_BYTES),
    )


class PromptSampler:
    """The router's half: offer() every parsed prompt; it records only while armed. It talks
    to Redis through the replica's publisher's client (one connection pool per replica, closed
    with it), configured from the same `telemetry` settings."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.tenant = ""
        self.deployment = ""
        self._arm: dict[str, Any] | None = None
        self._checked = 0.0
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def prefix(self) -> str:
        return str(self.publisher.prefix)

    def configure(self, config: dict[str, Any]) -> None:
        """After the publisher's configure (its Redis URL and key prefix)."""
        self.tenant = str(config.get("tenant") or "")
        self.deployment = str(config.get("deployment") or "")
        self._checked = 0.0  # a new config may come with a new arm record

    def offer(self, tenant: Any, raw_key: str | None, prompt: str, identity: Any) -> None:
        """Called for each parsed request; returns at once."""
        if identity is not None or not self.publisher.redis_url or not self.tenant or not raw_key:
            return
        if str(tenant) != self.tenant or len(self._pending) >= MAX_PENDING:
            return
        now = time.time()
        stale = now - self._checked >= ARM_CHECK_S
        if stale:
            self._checked = now  # one request a second reads the arm record again
        elif self._arm is None or self._arm["expires_at"] <= now:
            return  # not armed: nothing to do, no task
        record = self._record(hash_key(raw_key), prompt, refresh=stale)
        task = asyncio.get_running_loop().create_task(record)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _client(self) -> Any:
        publisher = self.publisher
        if publisher._redis is None:  # the publisher makes the same one on its next tick
            import redis.asyncio as aioredis

            publisher._redis = aioredis.Redis.from_url(str(publisher.redis_url))
        return publisher._redis

    async def _refresh(self) -> None:
        raw = await (await self._client()).get(arm_key(self.prefix, self.tenant, self.deployment))
        arm = json.loads(raw) if raw else None
        ok = isinstance(arm, dict) and isinstance(arm.get("run"), int)
        self._arm = arm if ok else None
        if self._arm is not None:
            self._arm["expires_at"] = float(self._arm.get("expires_at") or 0)
            self._arm["exclude"] = set(self._arm.get("exclude") or [])

    async def _record(self, key_hash: str, prompt: str, *, refresh: bool) -> None:
        try:
            if refresh:
                await self._refresh()
            arm, now = self._arm, time.time()
            if arm is None or arm["expires_at"] <= now or key_hash in arm["exclude"]:
                return
            count, per_prompt, total = limits(arm)
            # The sample outlives the recording: the run reads it until its verdict.
            keep_until = max(float(arm.get("keep_until") or 0), arm["expires_at"])
            ttl_ms = int((keep_until - now) * 1000) + 1
            run = arm["run"]
            await (await self._client()).eval(
                APPEND,
                3,
                sample_key(self.prefix, self.tenant, run),
                bytes_key(self.prefix, self.tenant, run),
                arm_key(self.prefix, self.tenant, self.deployment),
                clip(prompt, per_prompt),
                count,
                total,
                ttl_ms,
                run,
            )
        except Exception as exc:  # the sample is a drill's nicety: never the request's problem
            logger.warning("prompt sample not recorded: %s", exc)
