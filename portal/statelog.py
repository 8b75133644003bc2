"""State changes an operator wants on the console: deployments changing status, rollbacks,
incidents. One logger, `portal.state`, at INFO, told once the change commits; `manage.py up`
shows its lines (with warnings and errors) while every other INFO line goes to var/log/ only.

The arguments carry tenants' text (a manual rollback's reason, a contract's objective names in
an incident title): control characters are escaped, so no tenant can end the line and forge
another one on the operator's terminal, or send it escape sequences."""

from __future__ import annotations

import logging
import re
from typing import Any

from django.db import transaction

STATE_LOGGER = "portal.state"
logger = logging.getLogger(STATE_LOGGER)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(value: Any) -> Any:
    """`value` with every control character (newlines, ESC, C1, line separators) escaped."""
    if not isinstance(value, str):
        return value
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), value)


def state_changed(message: str, *args: Any) -> None:
    """Log `message % args` once the current transaction commits (at once outside one)."""
    safe = tuple(printable(arg) for arg in args)
    transaction.on_commit(lambda: logger.info(message, *safe))
