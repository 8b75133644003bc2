"""`/healthz` answers 200 when its dependencies answer and 503 naming the one that does not."""

from __future__ import annotations

import functools
from typing import Any

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


def test_livez_asks_nothing_so_an_outage_never_restarts_the_web_process(client: Client) -> None:
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        response = client.get("/livez")
    assert response.status_code == 200 and response.json() == {"status": "alive"}


def test_readyz_checks_the_broker_and_ray_too(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from portal.celery import app

    monkeypatch.setenv("PORTAL_RAY", "off")
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.json()
    assert ready.json()["checks"] == {"database": "ok", "redis": "ok", "broker": "ok",
                                      "ray": "skipped"}  # fmt: skip
    # A cluster whose dashboard does not answer: not ready, and it says why.
    monkeypatch.delenv("PORTAL_RAY")
    for name, value in {"RAY_ADDRESS": "127.0.0.1:1", "RAY_DASHBOARD_URL": "http://127.0.0.1:1",
                        "RAY_AUTH_TOKEN": "t"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    down = client.get("/readyz")
    assert down.status_code == 503 and down.json()["status"] == "unavailable"
    assert down.json()["checks"]["ray"] != "ok" and down.json()["checks"]["database"] == "ok"
    # A broker that does not answer.
    monkeypatch.setenv("PORTAL_RAY", "off")
    dead = functools.partial(app.connection_for_write, "redis://127.0.0.1:1/0")
    monkeypatch.setattr(app, "connection_for_write", dead)
    broken = client.get("/readyz")
    assert broken.status_code == 503 and broken.json()["checks"]["broker"] != "ok"


@pytest.mark.ray
def test_readyz_with_the_local_ray_head(
    client: Client, ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ray_cluster.portal_env().items():
        monkeypatch.setenv(name, value)
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["ray"] == "ok"
