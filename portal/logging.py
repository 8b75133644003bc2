"""Logging filter that scrubs credentials from every record before it is written."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

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


def _clean(value: object) -> object:
    return redact(value) if isinstance(value, str) else value


class RedactSecretsFilter(logging.Filter):
    """Scrub tokens, passwords and bearer headers from the message and from each argument.

    Arguments keep their shape (formatters such as uvicorn's access log unpack them).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_clean(arg) for arg in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {key: _clean(arg) for key, arg in record.args.items()}
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True
