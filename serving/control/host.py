"""What the portal's process tells the Django-free Ray adapter when it starts
(ServingConfig.ready): where its data lives, and how long a chaos drill holds each Serve API
call. A bare script (the cluster CLI, a Ray worker) keeps the defaults: PORTAL_DATA_DIR or
<repo>/var, and no delay."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def _no_delay() -> float:
    return 0.0


def _no_data_dir() -> Path | None:
    return None


call_delay: Callable[[], float] = _no_delay
data_dir: Callable[[], Path | None] = _no_data_dir


def install(*, delay: Callable[[], float], data: Callable[[], Path | None]) -> None:
    global call_delay, data_dir
    call_delay, data_dir = delay, data
