"""Reconciles are serialized by a row lock in PostgreSQL: a second one waits for the first."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from serving.control.cluster import RayTarget
from serving.control.serve_api import ServeApiError
from serving.deployments import reconcile as control
from serving.deployments.models import ReconcileLock

pytestmark = pytest.mark.django_db(transaction=True)

NOWHERE = RayTarget(
    address="127.0.0.1:1", dashboard_url="http://127.0.0.1:1", serve_url="http://127.0.0.1:1",
    token="x",
)  # fmt: skip


def test_a_second_reconcile_waits_for_the_lock_held_by_the_first() -> None:
    ReconcileLock.objects.get_or_create(id=1)
    held, release = threading.Event(), threading.Event()

    def first() -> None:  # what a running reconcile does: hold the row for its whole apply
        try:
            with transaction.atomic():
                ReconcileLock.objects.select_for_update().get(id=1)
                held.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=first)
    holder.start()
    assert held.wait(10)
    threading.Timer(1.0, release.set).start()
    started = time.monotonic()
    with pytest.raises(ServeApiError):  # it reaches Serve (unreachable) only after the lock
        control.reconcile(target=NOWHERE)
    waited = time.monotonic() - started
    holder.join()
    assert waited >= 0.9, f"the second reconcile did not wait for the lock ({waited:.2f} s)"
