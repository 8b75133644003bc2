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
