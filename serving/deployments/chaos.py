"""The control-plane chaos hook, Django side: a `control_plane_delay` drill holds every Serve
API call while its Redis key `<SLI_KEY_PREFIX>:chaos:control_plane_delay` exists (the drill sets
it with a TTL equal to the fault's expiry and deletes it at the revert). ServingConfig.ready()
hands `injected_delay.seconds` to the Django-free adapter (serving.control.host)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

CONTROL_DELAY_KEY = "{prefix}:chaos:control_plane_delay"
MAX_CONTROL_DELAY_MS = 10_000  # refresh_deployment_status (time limit 30 s) makes two calls


def control_delay_key() -> str:
    return CONTROL_DELAY_KEY.format(prefix=settings.SLI_KEY_PREFIX)


class InjectedDelay:
    """How long a `control_plane_delay` drill wants each Serve API call held (0 without one).
    Read at every call, so the delay ends the moment the key goes (revert or TTL). With Redis
    down there is no delay: the client must never fail because of its chaos hook."""

    RETRY_AFTER_S = 5.0

    def __init__(self) -> None:
        self._redis: Any = None
        self._url: str | None = None
        self._down_until = 0.0

    def seconds(self) -> float:
        url = settings.REDIS_URL
        key = control_delay_key()
        if time.monotonic() < self._down_until:
            return 0.0
        try:
            if self._redis is None or url != self._url:
                import redis

                self._redis = redis.Redis.from_url(
                    url, socket_timeout=0.5, socket_connect_timeout=0.5
                )
                self._url = url
            raw = self._redis.get(key)
        except Exception as exc:
            logger.warning("control_plane_delay key unreadable, no delay: %s", exc)
            self._redis, self._down_until = None, time.monotonic() + self.RETRY_AFTER_S
            return 0.0
        if not raw:
            return 0.0
        try:
            delay_ms = float(json.loads(raw).get("delay_ms", 0))
        except (ValueError, TypeError, AttributeError):
            return 0.0
        return min(max(delay_ms, 0.0), MAX_CONTROL_DELAY_MS) / 1000.0


injected_delay = InjectedDelay()
