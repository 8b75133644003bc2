"""`/healthz`: is this web process able to serve (database and Redis)?"""

from __future__ import annotations

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.urls import path


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _check_redis() -> str | None:
    import redis

    from portal import ratelimit

    try:
        ratelimit.redis_client(settings.REDIS_URL).ping()
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def healthz(request: HttpRequest) -> JsonResponse:
    """200 when every dependency answers; 503 naming the ones that do not."""
    checks = {"database": _check_database(), "redis": _check_redis()}
    failing = {name: error for name, error in checks.items() if error is not None}
    body = {
        "status": "ok" if not failing else "unavailable",
        "checks": {name: failing.get(name, "ok") for name in checks},
    }
    return JsonResponse(body, status=503 if failing else 200)


urlpatterns = [path("", healthz, name="healthz")]
