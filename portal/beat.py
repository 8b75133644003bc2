"""Celery beat's scheduler: django-celery-beat's, stamping beat's heartbeat every tick."""

from __future__ import annotations

import logging
from typing import Any

from django_celery_beat.schedulers import DatabaseScheduler

from portal import heartbeats

logger = logging.getLogger(__name__)


class PortalScheduler(DatabaseScheduler):  # type: ignore[misc]
    def tick(self, *args: Any, **kwargs: Any) -> Any:
        try:
            heartbeats.record_beat()
        except Exception as exc:  # Redis away: beat keeps scheduling; the page shows it stale
            logger.warning("beat's heartbeat not recorded: %s", exc)
        return super().tick(*args, **kwargs)
