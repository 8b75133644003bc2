"""Which request a log line belongs to: every request gets a request id (the client's
`X-Request-ID` when it is short and plain, else a new one; echoed in the response) and a trace
id (from the client's W3C `traceparent`, else a new one), held in portal.logging's context
variables for the request's duration, so `LOG_FORMAT=json` lines carry both (and one
`portal.access` line per request replaces uvicorn's access line, which cannot)."""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable

from django.conf import settings
from django.core.signals import request_finished
from django.http import HttpRequest, HttpResponse

from portal import logging as portal_logging

access_log = logging.getLogger("portal.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def request_ids(request: HttpRequest) -> tuple[str, str]:
    """(request id, trace id) for `request`: the client's when well-formed, else new ones."""
    given = request.headers.get("x-request-id") or ""
    rid = given if _REQUEST_ID.fullmatch(given) else secrets.token_hex(8)
    match = _TRACEPARENT.fullmatch((request.headers.get("traceparent") or "").strip().lower())
    trace = match.group(1) if match and set(match.group(1)) != {"0"} else secrets.token_hex(16)
    return rid, trace


class RequestContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        rid, trace = request_ids(request)
        # Kept until the request is finished (`_forget`, on request_finished): Django logs a
        # 4xx/5xx response after the middleware chain has returned.
        portal_logging.request_id.set(rid)
        portal_logging.trace_id.set(trace)
        started = time.perf_counter()
        response = self.get_response(request)
        response["X-Request-ID"] = rid
        if settings.LOG_FORMAT == "json":  # uvicorn's access line carries no ids
            access_log.info(
                "%s %s %s %.1f ms",
                request.method,
                request.path,
                response.status_code,
                (time.perf_counter() - started) * 1000,
            )
        return response


def _forget(**kwargs: object) -> None:
    portal_logging.request_id.set("")
    portal_logging.trace_id.set("")


request_finished.connect(_forget, dispatch_uid="portal.requestctx.forget")
