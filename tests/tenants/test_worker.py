"""With a real Celery worker on Redis: invitation mail and the beat task run in the worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection
from django.urls import reverse

from portal.celery import QUEUES
from portal.celery import app as celery_app
from tenants.models import Invitation
from tenants.tasks import invitations_expire
from tests.conftest import make_world

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Path]:
    mail_dir = tmp_path / "mail"
    mail_dir.mkdir()
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PORTAL_TEST_WORKER": "1",
        "EMAIL_FILE_PATH": str(mail_dir),
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }
    log = (tmp_path / "worker.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q", ",".join(QUEUES),
         "--concurrency", "1", "--pool", "solo", "--without-gossip", "--without-mingle", "-l", "INFO"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    celery_app.conf.task_always_eager = False
    try:
        deadline = time.monotonic() + 60
        while "ready" not in (tmp_path / "worker.log").read_text():
            assert process.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.2)
        yield mail_dir
    finally:
        celery_app.conf.task_always_eager = True
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_invitation_mail_is_sent_by_the_worker(worker: Path) -> None:
    world = make_world("Worker")
    response = world.client("owner").post(
        reverse("invitation-list"),
        {"email": "mailme@worker.example", "role": "viewer"},
        format="json",
    )
    assert response.status_code == 201
    accept_url = response.json()["accept_url"]

    def outbox() -> str:
        return "".join(path.read_text() for path in worker.iterdir())

    assert _wait_for(lambda: "To: mailme@worker.example" in outbox()), outbox()
    mail = outbox()
    assert "mailme@worker.example" in mail, mail
    assert accept_url in mail, (accept_url, mail)


def test_beat_task_runs_in_the_worker(worker: Path) -> None:
    from datetime import timedelta

    from django.utils import timezone

    world = make_world("Expiry")
    invitation = Invitation.objects.filter(tenant=world.tenant).first()
    assert invitation is not None and invitation.status == "accepted"
    pending = world.client("owner").post(
        reverse("invitation-list"),
        {"email": "late@expiry.example", "role": "viewer"},
        format="json",
    )
    Invitation.objects.filter(pk=pending.json()["id"]).update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    result = invitations_expire.delay()
    assert result.get(timeout=30) == 1
    assert Invitation.objects.get(pk=pending.json()["id"]).status == "expired"
