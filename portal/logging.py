"""Logging: a filter that scrubs credentials from every record before it is written, and with
`LOG_FORMAT=json` one JSON object a line carrying the request id and trace id of the request
the line belongs to (set by `portal.requestctx.RequestContextMiddleware`)."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

# The request a line belongs to: set per request by portal.requestctx, "" outside one.
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
trace_id: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")

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


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, request_id,
    trace_id, and the exception when there is one; every string redacted."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
            "request_id": request_id.get(),
            "trace_id": trace_id.get(),
        }
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["exception"] = redact(record.exc_text)
        return json.dumps(entry, ensure_ascii=False, default=str)
