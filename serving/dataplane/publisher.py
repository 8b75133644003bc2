"""The replica's identity (replica id, Serve app name) and the Publisher that writes a replica's
snapshot to Redis once a second (the version slots' SLI windows, the routers' state)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ray import serve

logger = logging.getLogger("ray.serve")
# A publish asked for early (`Publisher.soon`) comes at least this long after the last one.
SOON_S = 0.25


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
        self._soon: asyncio.Event | None = None

    def configure(self, telemetry: dict[str, Any]) -> None:
        url = telemetry.get("redis_url") or None
        if url != self.redis_url:
            self.redis_url, self._redis = url, None
        self.prefix = telemetry.get("prefix", "portal")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def soon(self) -> None:
        """Publish within SOON_S instead of at the next second (a version's failed request:
        the health tick sees a fault's first errors sooner). At most 1/SOON_S a second."""
        if self._soon is not None:
            self._soon.set()

    def stop(self) -> None:
        """No more publishes (the replica is stopping); a snapshot on its way may still land."""
        task, self._task = self._task, None
        if task is not None:
            # RuntimeError: its loop is closed (an object collected after its test).
            with contextlib.suppress(RuntimeError):
                task.cancel()
        self.redis_url = None

    @staticmethod
    async def _wait(soon: asyncio.Event, last: float) -> None:
        """A second after the last publish, or SOON_S after it once `soon` was called."""
        try:
            await asyncio.wait_for(soon.wait(), timeout=max(0.0, last + 1.0 - time.monotonic()))
        except TimeoutError:
            pass
        else:
            await asyncio.sleep(max(0.0, last + SOON_S - time.monotonic()))
        soon.clear()

    async def _loop(self) -> None:
        self._soon = soon = asyncio.Event()  # this loop's
        last = time.monotonic()
        while True:
            await self._wait(soon, last)
            last = time.monotonic()
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
