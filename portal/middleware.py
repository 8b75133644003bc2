"""A dependency that is away (PostgreSQL restarting, Redis down) is a clear 503 with
Retry-After, not a 500 with a stack trace: pages and API clients know to retry."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

logger = logging.getLogger(__name__)
RETRY_AFTER_S = 5


def _unavailable(exc: BaseException) -> str | None:
    """The dependency `exc` (or an error it was raised from) says is away, else None. Django
    re-raises some: a session that could not be saved while PostgreSQL restarts arrives as
    SessionInterrupted (a 400), raised from UpdateError, raised from the database error."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 5:
        what = _away(cause)
        if what is not None:
            return what
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return None


def _away(exc: BaseException) -> str | None:
    if isinstance(exc, OperationalError | InterfaceError):
        return "the database"
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover (redis is a dependency)
        return None
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return "Redis"
    return None


def unavailable_response(request: HttpRequest, exc: Exception) -> HttpResponse | None:
    """The 503 for `exc` when it says a dependency is away, else None."""
    what = _unavailable(exc)
    if what is None:
        return None
    logger.warning(
        "%s %s: %s is unavailable (%s)", request.method, request.path, what, type(exc).__name__
    )
    message = f"{what} is unavailable right now; retry in a few seconds."
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"error": {"code": "unavailable", "message": message}}, status=503)
    else:
        response = HttpResponse(
            "<!doctype html><title>Unavailable</title><h1>503: temporarily unavailable</h1>"
            f"<p>{message}</p>",
            status=503,
        )
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler400: a 400 that a dependency caused (see _unavailable) is a 503."""
    response = unavailable_response(request, exception)
    return response if response is not None else defaults.bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: errors outside views (a session saved by middleware while PostgreSQL
    restarts) get the same 503 when a dependency is away; anything else stays a 500."""
    exc = sys.exc_info()[1]
    if isinstance(exc, Exception):
        response = unavailable_response(request, exc)
        if response is not None:
            return response
    return defaults.server_error(request)


class DependencyUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return unavailable_response(request, exception)
