"""Worker and beat heartbeats (portal.heartbeats) and the platform status page that shows them:
a queue's workers stamp theirs when they run `portal.heartbeat` (beat sends one per queue),
beat stamps its own every tick; a silent one shows stale."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from portal import heartbeats
from portal.celery import QUEUES
from portal.tasks import heartbeat

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _clean() -> Any:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    pattern = f"{settings.SLI_KEY_PREFIX}:heartbeat:*"
    for key in client.scan_iter(pattern):
        client.delete(key)
    yield
    for key in client.scan_iter(pattern):
        client.delete(key)


def test_beat_sends_one_heartbeat_per_queue_to_that_queue() -> None:
    entries = [e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "portal.heartbeat"]
    assert sorted(e["options"]["queue"] for e in entries) == sorted(QUEUES)
    assert all(e["args"] == (e["options"]["queue"],) for e in entries)


def test_workers_and_beat_stamp_and_a_silent_one_goes_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_celery_beat.schedulers import DatabaseScheduler

    from portal.beat import PortalScheduler

    heartbeat.apply(args=("health",))
    heartbeats.record_worker("chaos", "old-host", now=time.time() - 120)
    # Beat's own tick stamps it (the database scheduler's work is not this test's).
    monkeypatch.setattr(DatabaseScheduler, "tick", lambda self, *a, **k: 5.0)
    scheduler = PortalScheduler.__new__(PortalScheduler)
    assert scheduler.tick() == 5.0
    seen = heartbeats.snapshot(QUEUES)
    assert seen["beat"] is not None and not seen["beat"]["stale"]
    assert [w["stale"] for w in seen["queues"]["health"]] == [False]
    assert [w["stale"] for w in seen["queues"]["chaos"]] == [True]
    assert seen["queues"]["validation"] == []


def test_the_status_page_is_for_platform_staff(client: Client, world_a: Any) -> None:
    heartbeat.apply(args=("default",))
    client.force_login(world_a.owner)
    assert client.get("/platform/status/").status_code == 302  # to the admin login
    world_a.owner.is_staff = True
    world_a.owner.save(update_fields=["is_staff"])
    page = client.get("/platform/status/").content.decode()
    assert 'data-testid="readiness"' in page and "database" in page
    assert "worker · default" in page and "alive" in page
    assert "no worker seen" in page  # the other queues, in this test
    assert "never seen" in page  # beat never ticked here
