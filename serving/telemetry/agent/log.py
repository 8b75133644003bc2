"""The short log of samples per group (a Redis stream) that a reconnecting browser resumes
from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from serving.telemetry.keys import gpu_keys

LOG_SECONDS = 300  # a reconnect can resume from up to 5 minutes back


def seq_key(seq: str) -> tuple[int, int]:
    """Order of two sequence ids ("<ms>-<n>", as Redis streams number their entries)."""
    ms, _, n = seq.partition("-")
    try:
        return int(ms), int(n or 0)
    except ValueError:
        return 0, 0


class RedisLog:
    """The log in Redis streams, one per group, trimmed to about LOG_SECONDS of samples."""

    def __init__(self, client: Any, prefix: str, maxlen: int) -> None:
        self.client, self.prefix, self.maxlen = client, prefix, maxlen

    async def append_many(self, items: Mapping[str, str]) -> dict[str, str]:
        groups = list(items)
        async with self.client.pipeline(transaction=False) as pipe:
            for group in groups:
                pipe.xadd(
                    self.prefix + group, {"d": items[group]}, maxlen=self.maxlen, approximate=True
                )
                pipe.expire(self.prefix + group, LOG_SECONDS * 2)
            ids = await pipe.execute()
        return {g: _text(i) for g, i in zip(groups, ids[::2], strict=True)}

    async def aclose(self) -> None:
        await self.client.aclose()

    async def since(self, group: str, seq: str, limit: int) -> list[tuple[str, str]]:
        rows = await self.client.xrange(self.prefix + group, min=f"({seq}", max="+", count=limit)
        return [(_text(i), _text(fields[b"d"])) for i, fields in rows]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def sample_log(hz: float = 5.0) -> RedisLog:
    """The log this installation uses: Redis streams, about LOG_SECONDS of samples at `hz`."""
    import redis.asyncio as aioredis

    maxlen = int(LOG_SECONDS * hz)
    return RedisLog(aioredis.Redis.from_url(settings.REDIS_URL), gpu_keys()["log"], maxlen)
