"""Logging filter that scrubs credentials from every record before it is written."""

from __future__ import annotations

import logging
import re

_PATTERNS = [
    (re.compile(r"aop_[A-Za-z0-9_\-]{8,}"), "aop_[redacted]"),
    (re.compile(r"inv_[A-Za-z0-9_\-]{8,}"), "inv_[redacted]"),
    (re.compile(r"(?i)(bearer\s+)[^\s'\"]+"), r"\1[redacted]"),
    (
        re.compile(r"(?i)((?:password|secret|token|api_key)[\"']?\s*[:=]\s*[\"']?)[^\s,'\"&}]+"),
        r"\1[redacted]",
    ),
]


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactSecretsFilter(logging.Filter):
    """Render the message once, scrub tokens, passwords and bearer headers from it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (a broken format string must not drop the record)
            message = str(record.msg)
        record.msg = redact(message)
        record.args = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True
