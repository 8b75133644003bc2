"""`manage.py up`: one supervisor for the whole portal (web, Celery worker, Celery beat).

It starts every part as a child process, prefixes their output, stops all of them cleanly on
Ctrl-C / SIGTERM (SIGTERM, then SIGKILL after a grace period), and stops everything if one
part dies, exiting non-zero so a service manager notices.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand


@dataclass
class Part:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = field(default=None, repr=False)


class Command(BaseCommand):
    help = "Run the portal: ASGI web server, Celery worker and Celery beat, under one supervisor."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default=os.environ.get("PORTAL_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-worker", action="store_true", help="do not start a worker")
        parser.add_argument("--no-beat", action="store_true", help="do not start beat")
        parser.add_argument("--grace", type=float, default=15.0, help="seconds to wait on stop")

    def handle(self, *args: Any, **opts: Any) -> None:
        self._stopping = False
        parts = self.plan(opts)
        self.prepare_embedded()
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        mode = "PostgreSQL + Redis" if settings.REDIS_URL else "embedded (SQLite, local broker)"
        self.stdout.write(f"[up] starting {', '.join(p.name for p in parts)} in {mode} mode")
        for part in parts:
            self.start(part)
        url = f"http://{opts['host']}:{opts['port']}/"
        ready = self.wait_ready(url + "healthz", parts)
        if ready:
            self.stdout.write(f"[up] portal ready on {url} (Ctrl-C stops everything)")
        exit_code = self.watch(parts) if ready else 1
        self.stop(parts, opts["grace"])
        self.stdout.write(f"[up] stopped (exit {exit_code})")
        sys.stdout.flush()
        if exit_code:
            raise SystemExit(exit_code)

    def plan(self, opts: dict[str, Any]) -> list[Part]:
        py = sys.executable
        parts = [
            Part(
                "web",
                [
                    py, "-m", "portal.serve",
                    "--host", opts["host"], "--port", str(opts["port"]),
                ],
            )
        ]  # fmt: skip
        if not opts["no_worker"]:
            parts.append(
                Part(
                    "worker",
                    [
                        py, "-m", "celery", "-A", "portal", "worker",
                        "-Q", "default,health,chaos", "--concurrency", "2",
                        "--loglevel", "INFO", "--without-gossip", "--without-mingle",
                    ],
                )
            )  # fmt: skip
        if not opts["no_beat"]:
            schedule = str(settings.DATA_DIR / "celerybeat-schedule")
            parts.append(
                Part(
                    "beat",
                    [py, "-m", "celery", "-A", "portal", "beat", "-l", "INFO", "-s", schedule],
                )
            )
        return parts

    def prepare_embedded(self) -> None:
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {})
        for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
            if key in options:
                os.makedirs(options[key], exist_ok=True)
        if settings.CELERY_RESULT_BACKEND.startswith("file://"):
            os.makedirs(settings.CELERY_RESULT_BACKEND.removeprefix("file://"), exist_ok=True)

    def start(self, part: Part) -> None:
        part.process = subprocess.Popen(  # noqa: S603  (argv built from sys.executable and fixed args)
            part.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops parts in order
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        part.reader = threading.Thread(target=self._pump, args=(part,), daemon=True)
        part.reader.start()
        self.stdout.write(f"[up] {part.name} started (pid {part.process.pid})")

    def _pump(self, part: Part) -> None:
        if part.process is None or part.process.stdout is None:
            return
        for raw in part.process.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.stdout.write(f"[{part.name}] {line}")
            self.stdout.flush()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True

    def wait_ready(self, url: str, parts: list[Part], timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping:
            if any(p.process is not None and p.process.poll() is not None for p in parts):
                self.stderr.write("[up] a part exited during start-up")
                return False
            try:
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback)
                    if response.status == 200:
                        return True
            except OSError:
                time.sleep(0.3)
        return False

    def watch(self, parts: list[Part]) -> int:
        while not self._stopping:
            for part in parts:
                code = part.process.poll() if part.process is not None else 0
                if code is not None:
                    self.stderr.write(f"[up] {part.name} exited with {code}; stopping the portal")
                    return code or 1
            time.sleep(0.3)
        return 0

    def stop(self, parts: list[Part], grace: float) -> None:
        self.stdout.write("[up] stopping")
        for part in reversed(parts):
            if part.process is not None and part.process.poll() is None:
                part.process.send_signal(signal.SIGTERM)  # warm shutdown; it stops its children
        deadline = time.monotonic() + grace
        for part in reversed(parts):
            if part.process is None:
                continue
            try:
                part.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"[up] {part.name} did not stop in {grace}s; killing it")
                os.killpg(part.process.pid, signal.SIGKILL)
                part.process.wait()
            if part.reader is not None:
                part.reader.join(timeout=2)
