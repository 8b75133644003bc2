"""The replica's identity (replica id, Serve app name) and the Publisher that writes a replica's
snapshot to Redis once a second (the version slots' SLI windows, the routers' state)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from ray import serve

logger = logging.getLogger("ray.serve")


_LOCAL_IDS = itertools.count(1)


def replica_id() -> str:
    """Serve's unique id of this replica; outside a replica (tests, an in-process data
    plane) one of its own per object, as Serve's are: a stopped object's goodbye must not
    speak for another one of the same process."""
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # outside a replica (unit tests)
        return f"pid-{os.getpid()}-{next(_LOCAL_IDS)}"


def app_name() -> str:
    try:
        return str(serve.get_replica_context().app_name)
    except Exception:  # outside a replica (unit tests)
        return ""


class Publisher:
    """Publishes a replica's snapshot (SLI window, or the router's breakers and recent
    request lifecycles) to Redis once a second."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        write: Callable[[Any, str, dict[str, Any]], Awaitable[None]],
    ) -> None:
        self.snapshot = snapshot
        self.write = write
        self.redis_url: str | None = None
        self.prefix = "portal"
        self._redis: Any = None
        self._task: asyncio.Task[None] | None = None

    def configure(self, telemetry: dict[str, Any]) -> None:
        url = telemetry.get("redis_url") or None
        if url != self.redis_url:
            self.redis_url, self._redis = url, None
        self.prefix = telemetry.get("prefix", "portal")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        """No more publishes (the replica is stopping); a snapshot on its way may still land."""
        task, self._task = self._task, None
        if task is not None:
            # RuntimeError: its loop is closed (an object collected after its test).
            with contextlib.suppress(RuntimeError):
                task.cancel()
        self.redis_url = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            snapshot = self.snapshot()
            if not self.redis_url:
                continue
            try:
                if self._redis is None:
                    import redis.asyncio as aioredis

                    self._redis = aioredis.Redis.from_url(self.redis_url)
                await self.write(self._redis, self.prefix, snapshot)
            except Exception as exc:  # telemetry must never take inference down
                logger.warning("telemetry publish failed: %s", exc)
                self._redis = None
