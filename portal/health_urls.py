"""Health endpoints: `/livez` (this process answers: no dependency is asked, so a probe never
restarts a web process for a database outage), `/readyz` (it can do its work: the database,
Redis, Celery's broker and the Ray dashboard answer; 503 naming the ones that do not) and
`/healthz` (database and Redis, kept for existing probes)."""

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


def _check_broker() -> str | None:
    from portal.celery import app

    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:  # kombu raises its transport's errors
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def _check_ray() -> str | None:
    """The Ray dashboard answers with the portal's token; None also when the portal runs
    without a data plane (PORTAL_RAY=off), which `readyz` reports as skipped."""
    from serving.control.cluster import ray_target_from_env
    from serving.control.serve_api import ServeApiError

    try:
        target = ray_target_from_env()
        target.serve_client(timeout=2).request("GET", "/api/version")
    except (ServeApiError, OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def livez(request: HttpRequest) -> JsonResponse:
    """200 while this process can answer at all; it asks nothing else."""
    return JsonResponse({"status": "alive"})


def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database, Redis, the broker and Ray answer; 503 naming what does not."""
    import os

    from portal.management.commands.up import ray_disabled

    checks: dict[str, str | None] = {
        "database": _check_database(),
        "redis": _check_redis(),
        "broker": _check_broker(),
    }
    ray = "skipped" if ray_disabled(dict(os.environ)) else (_check_ray() or "ok")
    failing = {name: error for name, error in checks.items() if error is not None}
    if ray not in ("ok", "skipped"):
        failing["ray"] = ray
    body = {
        "status": "ready" if not failing else "unavailable",
        "checks": {**{name: failing.get(name, "ok") for name in checks}, "ray": ray},
    }
    return JsonResponse(body, status=503 if failing else 200)


urlpatterns = [path("", healthz, name="healthz")]
