"""Smoke test of `make up` in embedded mode: SQLite, filesystem broker, no PostgreSQL or Redis.

It runs the real command in a fresh data folder, waits for the portal, uses it like a visitor
(login page, API schema, the printed demo login), then presses Ctrl-C (SIGINT to the process
group, as a terminal does) and checks that the supervisor stops every part it started.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 180.0  # migrate + demo_tenant + three processes (+ installs on a fresh checkout)
STOP_TIMEOUT = 30.0
# Variables that would point the portal at the test services or at a parent make.
DROPPED_ENV = (
    "DATABASE_URL",
    "REDIS_URL",
    "DJANGO_SETTINGS_MODULE",
    "DJANGO_ALLOW_ASYNC_UNSAFE",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STARTED = re.compile(r"^\[up\] (\w+) started \(pid (\d+)\)$", re.MULTILINE)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (a recycled pid)
        return True
    try:  # a zombie has exited; only its parent has not collected it yet
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _pids_with_env(marker: bytes) -> list[int]:
    """Pids of live processes whose environment holds `marker` (this run's data folder)."""
    found: list[int] = []
    if not Path("/proc/self/environ").exists():  # no procfs: the pid checks still run
        return found
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _opener() -> tuple[urllib.request.OpenerDirector, http.cookiejar.CookieJar]:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),  # loopback only, whatever *_proxy says
        urllib.request.HTTPCookieProcessor(jar),
    )
    return opener, jar


def _get(url: str, opener: urllib.request.OpenerDirector | None = None) -> tuple[int, str, str]:
    opener = opener or _opener()[0]
    with opener.open(url, timeout=10) as response:
        return response.status, response.geturl(), response.read().decode()


class Portal:
    """`make up` as a child process group with its output going to a file."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.data_dir = tmp_path / "data"
        self.log_path = tmp_path / "make-up.log"
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        env["PORTAL_DATA_DIR"] = str(self.data_dir)
        self.env_marker = f"PORTAL_DATA_DIR={self.data_dir}".encode()
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            ["make", "up", f"PORT={self.port}"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def output(self) -> str:
        return ANSI.sub("", self.log_path.read_text(errors="replace"))

    def started_parts(self) -> dict[str, int]:
        return {name: int(pid) for name, pid in STARTED.findall(self.output)}

    def wait_until_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error: Any = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"make up exited with {self.process.returncode}:\n{self.output}")
            try:
                status, _, _ = _get(f"{self.base}/accounts/login/")
            except (OSError, urllib.error.URLError) as exc:
                last_error = exc
            else:
                if status == 200:
                    return
                last_error = f"HTTP {status}"
            time.sleep(0.5)
        pytest.fail(f"portal not up after {timeout:.0f}s ({last_error}):\n{self.output}")

    def close(self) -> None:
        """Leave nothing behind, whatever state the test stopped in."""
        parts = self.started_parts()
        try:
            if self.process.poll() is None:
                _kill_group(self.process.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=STOP_TIMEOUT)
            _kill_group(self.process.pid, signal.SIGKILL)
            if self.process.poll() is None:
                self.process.wait(timeout=10)
            # Each part runs in its own session (pgid == pid); stop any the supervisor left.
            for pid in parts.values():
                if _alive(pid):
                    _kill_group(pid, signal.SIGKILL)
            for pid in _pids_with_env(self.env_marker):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            self._log.close()


def _demo_login(output: str) -> tuple[str, str, str]:
    tenant = re.search(r"^Demo tenant '.+' \(([a-z0-9-]+)\) is ready\.$", output, re.MULTILINE)
    email = re.search(r"^\s+e-mail:\s+(\S+)$", output, re.MULTILINE)
    password = re.search(r"^\s+password:\s+(\S+)$", output, re.MULTILINE)
    assert tenant and email and password, f"no demo login printed:\n{output}"
    return tenant[1], email[1], password[1]


def _log_in(base: str, email: str, password: str) -> tuple[str, str]:
    opener, jar = _opener()
    status, _, page = _get(f"{base}/accounts/login/", opener)
    assert status == 200
    csrf_cookie = next((c.value for c in jar if c.name == "csrftoken"), None)
    assert csrf_cookie, "login page set no csrftoken cookie"
    field = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert field, "login form has no CSRF field"
    body = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": field[1],
            "username": email,
            "password": password,
            "next": "",
        }
    ).encode()
    request = urllib.request.Request(  # noqa: S310 (loopback)
        f"{base}/accounts/login/", data=body, headers={"Referer": f"{base}/accounts/login/"}
    )
    with opener.open(request, timeout=10) as response:  # follows the redirects to the tenant
        assert response.status == 200
        return response.geturl(), response.read().decode()


def test_make_up_embedded_serves_and_stops_cleanly(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    portal = Portal(tmp_path)
    try:
        portal.wait_until_up(START_TIMEOUT)
        assert (portal.data_dir / "portal.sqlite3").exists(), "embedded mode uses SQLite"

        slug, email, password = _demo_login(portal.output)
        assert email == os.environ.get("DEMO_EMAIL", "demo@example.com")

        status, _, schema = _get(f"{portal.base}/api/v1/schema/")
        assert status == 200
        assert "openapi:" in schema

        final_url, page = _log_in(portal.base, email, password)
        assert re.fullmatch(rf"{re.escape(portal.base)}/t/[a-z0-9-]+/", final_url), final_url
        assert final_url == f"{portal.base}/t/{slug}/"
        assert 'data-testid="tenant-heading"' in page

        # Everything printed its start line before the portal answered.
        deadline = time.monotonic() + 10
        while len(portal.started_parts()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        parts = portal.started_parts()
        assert set(parts) == {"web", "worker", "beat"}, portal.output
        assert all(_alive(pid) for pid in parts.values()), parts

        _kill_group(portal.process.pid, signal.SIGINT)  # Ctrl-C in the terminal
        try:
            portal.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make up still running {STOP_TIMEOUT:.0f}s after SIGINT:\n{portal.output}")

        output = portal.output
        assert "[up] stopped (exit 0)" in output, output
        assert "--- Logging error ---" not in output, output  # e.g. a filter breaking a handler
        assert "Traceback" not in output, output
        assert not _listening(portal.port), "the web server still listens"
        left = {name: pid for name, pid in parts.items() if _alive(pid)}
        assert not left, f"parts still running after stop: {left}"
        assert not _pids_with_env(portal.env_marker), "processes of this portal are left"
    finally:
        portal.close()
