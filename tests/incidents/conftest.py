"""Fixtures shared by the incident tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.incidents.test_notify import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()
    thread.join(timeout=5)
