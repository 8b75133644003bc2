"""No head-of-line blocking: a reconcile applies and returns; the applications are followed by
short re-checks a second apart (each its own task), and every queue has workers of its own in
`manage.py up`, so a validation never waits behind a reconcile nor a health tick behind either."""

from __future__ import annotations

import time
from typing import Any

import pytest

from portal.celery import QUEUES
from portal.management.commands.up import WORKERS
from serving.deployments import reconcile as control
from serving.deployments import tasks
from serving.deployments.models import DeploymentStatus
from serving.registry.tasks import validate_version


class Scheduled:
    """Stands in for the broker: what follow_deployments.apply_async was asked to run."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *, kwargs: dict[str, Any], countdown: float) -> None:
        self.calls.append({"kwargs": kwargs, "countdown": countdown})


@pytest.fixture
def scheduled(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Scheduled:
    calls = Scheduled()
    monkeypatch.setattr(tasks.follow_deployments, "apply_async", calls)
    settings.CELERY_TASK_ALWAYS_EAGER = False  # as a real worker
    return calls


@pytest.mark.parametrize(
    ("statuses", "again"),
    [
        ({1: DeploymentStatus.DEPLOYING, 2: DeploymentStatus.RUNNING}, True),
        ({1: DeploymentStatus.PENDING}, True),
        ({1: DeploymentStatus.DELETING}, True),
        ({1: DeploymentStatus.RUNNING, 2: DeploymentStatus.FAILED}, False),
    ],
)
def test_a_follow_up_checks_once_and_comes_back_while_something_is_unsettled(
    scheduled: Scheduled, monkeypatch: pytest.MonkeyPatch, statuses: dict[int, str], again: bool
) -> None:
    monkeypatch.setattr(control, "serve_client", lambda: object())
    monkeypatch.setattr(control, "refresh_status", lambda client: statuses)
    until = time.time() + 30
    assert tasks.follow_deployments.run(until=until) == statuses
    if again:
        assert scheduled.calls == [{"kwargs": {"until": until}, "countdown": tasks.FOLLOW_EVERY_S}]
    else:
        assert scheduled.calls == []


def test_following_stops_at_its_deadline(
    scheduled: Scheduled, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "serve_client", lambda: object())
    monkeypatch.setattr(control, "refresh_status", lambda client: {1: DeploymentStatus.DEPLOYING})
    tasks.follow_deployments.run(until=time.time() - 1)
    assert scheduled.calls == []  # the beat's periodic refresh carries on


def test_a_reconcile_returns_at_once_and_hands_following_on(
    scheduled: Scheduled, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Run:
        pk, skipped = 7, False

    monkeypatch.setattr(control, "reconcile", lambda force=False: Run())
    started = time.monotonic()
    assert tasks.reconcile.run() == {"run": 7, "skipped": False}
    assert time.monotonic() - started < 1.0  # no waiting for the applications to settle
    [call] = scheduled.calls
    assert call["countdown"] == tasks.FOLLOW_EVERY_S
    assert 0 < call["kwargs"]["until"] - time.time() <= tasks.FOLLOW_FOR_S


def test_eager_tasks_never_reschedule_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Scheduled()
    monkeypatch.setattr(tasks.follow_deployments, "apply_async", calls)
    tasks.follow_later(until=time.time() + 30)  # the test settings run tasks eagerly
    assert calls.calls == []


def test_every_queue_has_workers_of_its_own_in_up() -> None:
    consumed = [queue for _, queues, _ in WORKERS for queue in queues.split(",")]
    assert sorted(consumed) == sorted(QUEUES), "each queue consumed by exactly one worker part"
    alone = {queues for _, queues, _ in WORKERS}
    assert {"health", "validation", "checks"} <= alone  # never behind a reconcile or a drill
    assert validate_version.queue == "validation"
    from serving.ops.checks.tasks import run_version_check

    assert run_version_check.queue == "checks"  # a tenant's checks never delay validations
    assert tasks.reconcile.queue == tasks.follow_deployments.queue == "default"
