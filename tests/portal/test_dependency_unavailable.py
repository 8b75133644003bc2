"""A dependency that is away is a clear 503 with Retry-After (API: the portal's JSON error)."""

from __future__ import annotations

import json

import pytest
from django.db import OperationalError
from django.http import HttpResponse
from django.test import RequestFactory
from redis.exceptions import ConnectionError as RedisConnectionError

from portal.middleware import DependencyUnavailableMiddleware


def _middleware() -> DependencyUnavailableMiddleware:
    return DependencyUnavailableMiddleware(lambda request: HttpResponse("ok"))


@pytest.mark.parametrize(
    ("exc", "what"),
    [(OperationalError("server closed the connection"), "the database"),
     (RedisConnectionError("Connection refused"), "Redis")],
)  # fmt: skip
def test_api_and_pages_get_a_503_naming_the_dependency(exc: Exception, what: str) -> None:
    factory = RequestFactory()
    api = _middleware().process_exception(factory.get("/api/v1/incidents/"), exc)
    assert api is not None and api.status_code == 503 and api["Retry-After"] == "5"
    body = json.loads(api.content)
    assert body["error"]["code"] == "unavailable" and what in body["error"]["message"]
    page = _middleware().process_exception(factory.get("/t/acme/"), exc)
    assert page is not None and page.status_code == 503 and what in page.content.decode()


def test_other_errors_are_left_alone() -> None:
    request = RequestFactory().get("/t/acme/")
    assert _middleware().process_exception(request, ValueError("a bug")) is None


def test_a_session_lost_to_the_database_is_a_503_not_a_400() -> None:
    """As Django chains it: the session's save fails (DatabaseError -> UpdateError), the
    session middleware turns that into SessionInterrupted, a 400."""
    from django.contrib.sessions.backends.base import UpdateError
    from django.contrib.sessions.exceptions import SessionInterrupted

    from portal.middleware import bad_request

    request = RequestFactory().get("/t/acme/")
    try:
        try:
            try:
                raise OperationalError("terminating connection due to administrator command")
            except OperationalError:
                raise UpdateError  # noqa: B904 (as Django does: the context carries the cause)
        except UpdateError:
            raise SessionInterrupted("The request's session was deleted.")  # noqa: B904
    except SessionInterrupted as exc:
        assert bad_request(request, exc).status_code == 503
    assert bad_request(request, SessionInterrupted("tampered")).status_code == 400
