"""Heartbeats of the processes nobody else watches: each Celery queue's workers (a beat entry
per queue runs `portal.heartbeat` there every HEARTBEAT_S) and beat itself (its scheduler
stamps every tick). Redis layout, under SLI_KEY_PREFIX:

* `<prefix>:heartbeat:queue:<queue>`: hash, worker hostname -> the time it ran the heartbeat;
* `<prefix>:heartbeat:beat`: the time of beat's last tick, with its host and pid.

Read by the platform status page (portal.status_views); a beat or queue silent for longer than
STALE_AFTER heartbeats is shown as stale.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from django.conf import settings

HEARTBEAT_S = 10.0
STALE_AFTER = 3  # missed heartbeats before a worker or beat shows stale
TTL_S = 24 * 3600  # a queue's entries outlive a weekend's silence, not forever


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)


def _key(*parts: str) -> str:
    return ":".join([settings.SLI_KEY_PREFIX, "heartbeat", *parts])


def record_worker(queue: str, hostname: str, now: float | None = None) -> None:
    client = _redis()
    key = _key("queue", queue)
    client.hset(key, hostname[:200], json.dumps({"at": now or time.time()}))
    client.expire(key, TTL_S)


def record_beat(now: float | None = None) -> None:
    entry = {"at": now or time.time(), "host": socket.gethostname(), "pid": os.getpid()}
    _redis().set(_key("beat"), json.dumps(entry), ex=TTL_S)


def snapshot(queues: tuple[str, ...], now: float | None = None) -> dict[str, Any]:
    """Beat's last tick and each queue's workers, with their age and whether they are stale."""
    now = now or time.time()
    stale_s = HEARTBEAT_S * STALE_AFTER
    client = _redis()
    raw_beat = client.get(_key("beat"))
    beat = json.loads(raw_beat) if raw_beat else None
    if beat is not None:
        beat["age_s"] = round(now - float(beat["at"]), 1)
        beat["stale"] = beat["age_s"] > stale_s
    out: dict[str, Any] = {"beat": beat, "queues": {}, "stale_after_s": stale_s}
    for queue in queues:
        workers = []
        for host, raw in sorted(client.hgetall(_key("queue", queue)).items()):
            at = float(json.loads(raw)["at"])
            age = round(now - at, 1)
            workers.append(
                {"hostname": host.decode(), "at": at, "age_s": age, "stale": age > stale_s}
            )
        out["queues"][queue] = workers
    return out
