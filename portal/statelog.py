"""State changes an operator wants on the console: deployments changing status, rollbacks,
incidents. One logger, `portal.state`, at INFO, told once the change commits; `manage.py up`
shows its lines (with warnings and errors) while every other INFO line goes to var/log/ only."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

STATE_LOGGER = "portal.state"
logger = logging.getLogger(STATE_LOGGER)


def state_changed(message: str, *args: Any) -> None:
    """Log `message % args` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: logger.info(message, *args))
