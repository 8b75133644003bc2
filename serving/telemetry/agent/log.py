"""The short log of samples per group (a Redis stream, or this process's memory without
Redis) that a reconnecting browser resumes from."""

from __future__ import annotations

import time
from collections import deque
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


class MemoryLog:
    """The log in this process (embedded mode: the in-memory channel layer is per process)."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self.streams: dict[str, deque[tuple[str, str]]] = {}
        self._last = (0, 0)

    def _next(self) -> str:
        ms = int(time.time() * 1000)
        self._last = (ms, 0) if ms > self._last[0] else (self._last[0], self._last[1] + 1)
        return f"{self._last[0]}-{self._last[1]}"

    async def append_many(self, items: Mapping[str, str]) -> dict[str, str]:
        seqs = {}
        for group, payload in items.items():
            seq = self._next()
            stream = self.streams.setdefault(group, deque(maxlen=self.maxlen))
            stream.append((seq, payload))
            seqs[group] = seq
        return seqs

    async def aclose(self) -> None:
        """Nothing to close: the log lives as long as the process."""

    async def since(self, group: str, seq: str, limit: int) -> list[tuple[str, str]]:
        after = seq_key(seq)
        stream = self.streams.get(group, deque())
        return [(s, p) for s, p in stream if seq_key(s) > after][-limit:]


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


_MEMORY_LOG: MemoryLog | None = None


def sample_log(hz: float = 5.0) -> MemoryLog | RedisLog:
    """The log this installation uses: Redis streams, or this process's memory without Redis."""
    global _MEMORY_LOG
    maxlen = int(LOG_SECONDS * hz)
    if settings.REDIS_URL:
        import redis.asyncio as aioredis

        return RedisLog(aioredis.Redis.from_url(settings.REDIS_URL), gpu_keys()["log"], maxlen)
    if _MEMORY_LOG is None:
        _MEMORY_LOG = MemoryLog(maxlen)
    return _MEMORY_LOG
