"""What `make up` prints: every line in var/log/<part>.log; on the terminal only warnings,
errors (a traceback whole) and state changes (logger portal.state), unless --verbose."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from portal.console import PartLog
from portal.statelog import STATE_LOGGER, state_changed
from tests.support.worlds import TenantWorld

LINES = [
    ("2026-12-06 00:16:28,208 INFO celery.app.trace Task serving.health_tick succeeded", False),
    ("2026-12-06 00:16:28,208 INFO portal.state deployment t/demo: pending -> deploying", True),
    ("2026-12-06 00:16:29,001 WARNING serving.telemetry no GPU: simulated provider in use", True),
    ("2026-12-06 00:16:27.184 UTC [5786] LOG:  checkpoint starting: time", False),
    ("2026-12-06 00:16:27.184 UTC [5786] FATAL:  the database system is shutting down", True),
    ("Traceback (most recent call last):", True),
    ('  File "serving/ops/tasks.py", line 20, in health_tick', True),
    ("    tick()", True),
    ("redis.exceptions.ConnectionError: Error 111 connecting to 127.0.0.1:56379.", True),
    ('INFO:     127.0.0.1:54556 - "GET /healthz HTTP/1.1" 200 OK', False),
    ("5274:M 06 Dec 2026 # WARNING Memory overcommit must be enabled! Without it, ...", False),
]


def test_the_terminal_gets_what_a_person_acts_on_and_the_file_gets_everything(
    tmp_path: Path,
) -> None:
    log = PartLog(tmp_path / "log" / "worker.log", verbose=False)
    shown = [text for text, _ in LINES if log.line(text)]
    log.close()
    assert shown == [text for text, show in LINES if show]
    assert (tmp_path / "log" / "worker.log").read_text().splitlines() == [t for t, _ in LINES]


def test_verbose_shows_every_line(tmp_path: Path) -> None:
    log = PartLog(tmp_path / "web.log", verbose=True)
    assert all(log.line(text) for text, _ in LINES)
    log.close()


@pytest.mark.django_db(transaction=True)
def test_a_state_change_is_told_once_it_commits_and_never_if_it_rolls_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=STATE_LOGGER)
    with transaction.atomic():
        state_changed("deployment %s/%s: %s -> %s", "t", "demo", "pending", "deploying")
        assert not caplog.records  # not before the commit
    assert [r.getMessage() for r in caplog.records] == ["deployment t/demo: pending -> deploying"]
    caplog.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        state_changed("incident %s opened", 7)
        raise RuntimeError("rolled back")
    assert not caplog.records


@pytest.mark.django_db
def test_a_tenants_text_cannot_forge_a_console_line_or_send_escape_sequences(
    world_a: TenantWorld, caplog: pytest.LogCaptureFixture, django_capture_on_commit_callbacks: Any
) -> None:
    """Hostile tenant: an incident title built from its own text (here the objective name a
    contract gives, as a breach records it) reaches the operator's terminal as one line."""
    from django.utils import timezone

    from incidents import services as incident_services
    from serving.deployments.models import Deployment

    caplog.set_level(logging.INFO, logger=STATE_LOGGER)
    deployment = Deployment.objects.create(tenant=world_a.tenant, name="victim")
    forged = "x\n[up] portal ready on http://evil.example/\x1b[2J\u2028done"
    with django_capture_on_commit_callbacks(execute=True):
        incident_services.breach_record(
            tenant=world_a.tenant, deployment=deployment, group="stable", objective=forged,
            kind="fast", severity="page", action="notify", detail="", observed={},
            detected_at=timezone.now(),
        )  # fmt: skip
    [line] = [r.getMessage() for r in caplog.records if "opened" in r.getMessage()]
    assert "\n" not in line and "\x1b" not in line and "\u2028" not in line
    assert "x\\n[up] portal ready" in line and "\\x1b[2J" in line
