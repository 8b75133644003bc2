"""The parts `manage.py up` supervises, and what it shows on the terminal. Every line a part
prints goes to its own file under var/log/ (`<part>.log`); the terminal gets only what a
person acts on: warnings, errors (a traceback whole), and the portal's state changes (logger
`portal.state`: deployments changing status, rollbacks, incidents). `--verbose` shows every
line again."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from portal.statelog import STATE_LOGGER

NOTABLE = re.compile(r"\b(WARNING|WARN|ERROR|CRITICAL|FATAL|PANIC)\b")
# Warnings that do not apply to how the portal runs its parts, kept in the log file only:
# Valkey asks for vm.overcommit_memory=1 for its background saves, and the embedded Valkey
# never saves (--save "").
NOT_FOR_THE_TERMINAL = ("Memory overcommit must be enabled",)
TRACEBACK = "Traceback (most recent call last)"


class PartLog:
    """One part's log file, and the decision which of its lines the terminal shows."""

    def __init__(self, path: Path, *, verbose: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.verbose = verbose
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._in_traceback = False

    def line(self, text: str) -> bool:
        """Keep `text` in the file; True when the terminal should show it too."""
        self._file.write(text + "\n")
        self._file.flush()
        if self._in_traceback:
            # The frames are indented; the first line that is not ends it (the exception).
            self._in_traceback = text[:1].isspace()
            return True
        if TRACEBACK in text:
            self._in_traceback = True
            return True
        if any(known in text for known in NOT_FOR_THE_TERMINAL):
            return self.verbose
        return self.verbose or bool(NOTABLE.search(text)) or f" {STATE_LOGGER} " in text

    def close(self) -> None:
        self._file.close()


@dataclass
class Part:
    """One child process of the supervisor: its argv, how it runs and stops, its log."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = field(default=None, repr=False)
    # Set by the output reader when the part prints `ready_marker` (the Ray head's started line).
    ready_marker: str | None = None
    ready: threading.Event = field(default_factory=threading.Event, repr=False)
    user: str | None = None  # the embedded PostgreSQL runs as its system user under root
    stop_signal: int = signal.SIGTERM
    log: PartLog | None = field(default=None, repr=False)  # var/log/<name>.log
