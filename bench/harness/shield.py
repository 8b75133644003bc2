"""Cleanup that runs to the end, whatever signal arrives meanwhile."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def interrupt_on_sigterm() -> None:
    """`kill` cleans up like Ctrl-C."""
    signal.signal(signal.SIGTERM, _interrupt)


@contextlib.contextmanager
def shielded_cleanup() -> Iterator[None]:
    """SIGINT and SIGTERM are ignored inside the block, then restored."""
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
