"""`/healthz` answers 200 when its dependencies answer and 503 naming the one that does not."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


def test_healthy_portal_reports_each_check(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}


def test_unreachable_redis_gives_503_naming_it(client: Client) -> None:
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok"
    assert "ConnectionError" in body["checks"]["redis"]
