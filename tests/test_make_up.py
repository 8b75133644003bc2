"""Smoke tests of `make up` with no DATABASE_URL / REDIS_URL: the portal starts its embedded
PostgreSQL and Valkey (portal/embedded.py, on free loopback ports here) before anything else.

Each runs the real command in a fresh data folder, waits for the portal, uses it like a visitor
(login page, API schema, the printed demo login), then presses Ctrl-C (SIGINT to the process
group, as a terminal does) and checks that the supervisor stops every part it started.

The first runs without a data plane (PORTAL_RAY=off: fast, for CI on two cores): the demo
deployment is created and stays pending while the worker's reconcile retries. The second
(`ray`) runs the local Ray head on free ports and calls the demo deployment through the Serve
proxy with the printed inference key, and checks every Ray listener is on loopback.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
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

import psycopg
import pytest

from serving.control.cluster import HeadState, LocalHeadConfig, head_processes, listening_sockets
from tests.ray_cluster import free_ports

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 180.0  # migrate + demo_tenant + three processes (+ installs on a fresh checkout)
STOP_TIMEOUT = 30.0
# With Ray: its head starts before the web server; the demo replica loads the tiny model.
RAY_SERVE_TIMEOUT = 180.0  # from `make up` to the first completion through the Serve proxy
RAY_STOP_TIMEOUT = 90.0  # web/worker/beat (15 s grace), then the head by PID
# Variables that would point the portal at the test services, another Ray cluster or a parent
# make.
DROPPED_ENV = (
    "DATABASE_URL",
    "REDIS_URL",
    "DJANGO_SETTINGS_MODULE",
    "DJANGO_ALLOW_ASYNC_UNSAFE",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
    "PORTAL_RAY",
    "PORTAL_UP_VERBOSE",
    "RAY_ADDRESS",
    "RAY_DASHBOARD_URL",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_SERVE_URL",
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STARTED = re.compile(r"^\[up\] ([\w-]+) started \(pid (\d+)\)$", re.MULTILINE)


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

    def __init__(
        self, tmp_path: Path, *, port: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.port = port or _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.data_dir = (tmp_path / "data").resolve()
        self.log_path = tmp_path / "make-up.log"
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV} | (env or {})
        env["PORTAL_DATA_DIR"] = str(self.data_dir)
        self.pg_port, self.redis_port = _free_port(), _free_port()
        env["PORTAL_EMBEDDED_PG_PORT"] = str(self.pg_port)
        env["PORTAL_EMBEDDED_REDIS_PORT"] = str(self.redis_port)
        self.env = env
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

    def part_log(self, part: str) -> str:
        """What a part printed (all of it: the terminal shows only what matters)."""
        path = self.data_dir / "log" / f"{part}.log"
        return ANSI.sub("", path.read_text(errors="replace")) if path.exists() else ""

    def wait_for_log(self, part: str, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.part_log(part), re.MULTILINE):
            if time.monotonic() > deadline:
                pytest.fail(f"no {pattern!r} in {part}.log after {timeout:.0f}s:\n{self.output}")
            time.sleep(0.3)

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

    def wait_for_output(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output, re.MULTILINE)
            if found:
                return found
            time.sleep(0.3)
        pytest.fail(f"no {pattern!r} in the output after {timeout:.0f}s:\n{self.output}")

    def ctrl_c(self, timeout: float) -> str:
        """SIGINT to the process group, as a terminal's Ctrl-C; the output once it stopped."""
        _kill_group(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make up still running {timeout:.0f}s after SIGINT:\n{self.output}")
        return self.output

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Read the portal's own (embedded) database beside the running portal."""
        url = f"postgresql://postgres@127.0.0.1:{self.pg_port}/portal"
        with psycopg.connect(url, connect_timeout=10) as db:
            return db.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def deployment_status(self, name: str) -> str | None:
        rows = self.query(
            "SELECT status FROM serving_deployment WHERE name = %s AND deleted_at IS NULL",
            (name,),
        )
        return None if not rows else str(rows[0][0])

    def row_counts(self) -> dict[str, int]:
        tables = {
            "model": "serving_model",
            "version": "serving_modelversion",
            "deployment": "serving_deployment",
            "key": "serving_inferencekey",
            "drill": "incidents_chaosdrill",
        }
        return {
            name: int(self.query(f"SELECT COUNT(*) FROM {table}")[0][0])  # noqa: S608
            for name, table in tables.items()
        }

    def close(self, stop_timeout: float = STOP_TIMEOUT) -> None:
        """Leave nothing behind, whatever state the test stopped in."""
        parts = self.started_parts()
        try:
            if self.process.poll() is None:
                _kill_group(self.process.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=stop_timeout)
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


def _demo_deployment(output: str) -> tuple[str, str]:
    """The inference key and the completions URL `demo_tenant` printed for the demo."""
    key = re.search(r"^\s+inference key:\s+(ik_\S+)$", output, re.MULTILINE)
    curl = re.search(r"^\s+curl -s (\S+/v1/completions) ", output, re.MULTILINE)
    assert key and curl, f"no demo deployment printed:\n{output}"
    return key[1], curl[1]


def _complete(url: str, key: str, prompt: str = "Hello") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(  # noqa: S310 (loopback)
        url,
        data=json.dumps({"prompt": prompt, "max_tokens": 8}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _opener()[0].open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, {"raw": body.decode(errors="replace")}


def _log_in(base: str, email: str, password: str) -> tuple[str, str, urllib.request.OpenerDirector]:
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
        return response.geturl(), response.read().decode(), opener


DRILL_TIMEOUT_S = 180.0  # the click to the rollback: detection (10 s rule) and the switch


def _drill_story(base: str, slug: str, email: str, password: str, portal: Portal) -> None:
    """What a new user sees after logging in: v1 stable and v2 as the canary at 20% with
    the traffic part reaching both; one click on the overview's "Run a drill" (an error burst
    on the canary); on the run page, detection with its incident, the rollback (MTTR), live.
    Checked in headless Chromium (screenshot in test-artifacts/) and through the API."""
    from playwright.sync_api import expect, sync_playwright

    from tests.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page()
            page.goto(f"{base}/accounts/login/")
            page.fill("input[name=username]", email)
            page.fill("input[name=password]", password)
            page.click("button[type=submit]")
            page.wait_for_url(f"**/t/{slug}/**")
            api = page.request  # the browser's session
            demo = api.get(f"{base}/api/v1/deployments/").json()["results"][0]
            assert demo["revision"]["canary_version"] == "demo-llama:v2", demo
            assert demo["revision"]["canary_percent"] == 20, demo
            groups = portal.query(
                'SELECT DISTINCT s."group" FROM serving_slisample s '
                "JOIN serving_deployment d ON d.id = s.deployment_id WHERE d.name = 'demo'"
            )
            page.goto(f"{base}/t/{slug}/")
            page.get_by_test_id("run-drill").click()
            page.wait_for_url("**/drill-runs/**")
            mttr = page.get_by_test_id("run-mttr")
            expect(mttr).to_contain_text(" s", timeout=DRILL_TIMEOUT_S * 1000)
            expect(page.get_by_test_id("run-mttd")).to_contain_text("incident #")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "make-up-drill.png"), full_page=True)
            rollbacks = api.get(f"{base}/api/v1/rollbacks/").json()["results"]
            assert [r["status"] for r in rollbacks] == ["done"], rollbacks
            assert rollbacks[0]["trigger"] == "breach", rollbacks
            incidents = api.get(f"{base}/api/v1/incidents/").json()["results"]
            assert len(incidents) >= 1, incidents
        finally:
            browser.close()
    assert ("canary",) in groups, groups  # the traffic reached the canary before the drill


def test_make_up_embedded_serves_and_stops_cleanly(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # No data plane: the demo deployment is created and stays pending; the reconcile task and
    # the status refresh say so in one line each, without tracebacks (checked below).
    portal = Portal(tmp_path, env={"PORTAL_RAY": "off"})
    try:
        portal.wait_until_up(START_TIMEOUT)
        assert (portal.data_dir / "postgres" / "PG_VERSION").exists(), "the embedded PostgreSQL"
        assert portal.query("SELECT inet_server_addr()::text") == [("127.0.0.1/32",)]
        # Printed right after the supervisor's own readiness check, which can trail ours.
        portal.wait_for_output(
            re.escape("[up] Ray: off (PORTAL_RAY=off); deployments stay pending"), timeout=30
        )

        slug, email, password = _demo_login(portal.output)
        assert email == os.environ.get("DEMO_EMAIL", "demo@example.com")

        status, _, schema = _get(f"{portal.base}/api/v1/schema/")
        assert status == 200
        assert "openapi:" in schema

        final_url, page, opener = _log_in(portal.base, email, password)
        assert re.fullmatch(rf"{re.escape(portal.base)}/t/[a-z0-9-]+/", final_url), final_url
        assert final_url == f"{portal.base}/t/{slug}/"
        assert 'data-testid="tenant-heading"' in page

        # No GPU here: this node's agent runs on the simulated provider, and the dashboard
        # says so.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            status, _, gpus = _get(f"{portal.base}/t/{slug}/gpus/", opener)
            if 'data-testid="gpu-simulated"' in gpus:
                break
            time.sleep(0.5)
        assert status == 200 and 'data-testid="gpu-simulated"' in gpus, gpus[-2000:]
        assert "SIMULATED" in gpus

        # Everything printed its start line before the portal answered.
        deadline = time.monotonic() + 10
        while len(portal.started_parts()) < 9 and time.monotonic() < deadline:
            time.sleep(0.2)
        parts = portal.started_parts()
        workers = ["worker", "worker-health", "worker-validation", "worker-checks"]
        assert list(parts) == ["postgres", "valkey", "web", "gpu-agent", *workers, "beat"], (
            portal.output
        )
        assert all(_alive(pid) for pid in parts.values()), parts

        # The demo deployment exists and waits for a cluster; the worker retries its reconcile.
        _demo_deployment(portal.output)
        assert "Ray is off (PORTAL_RAY=off): the deployment stays pending." in portal.output
        portal.wait_for_log(
            "worker", r"Task serving\.reconcile\[[^]]+\] retry: .*ServeApiError", timeout=30
        )
        # The terminal keeps to one ready block, warnings, errors and state changes: the
        # parts' INFO lines (Celery's banners and task lines, uvicorn's access log) are in
        # var/log/<part>.log only.
        block = portal.output[portal.output.index("[up] portal ready on") :]
        assert "e-mail:" in block and "inference key:" in block, block
        assert not re.search(
            r"^\[(web|worker[\w-]*|beat|gpu-agent)\] .*\bINFO\b", portal.output, re.M
        )
        assert "GET /healthz" in portal.part_log("web")
        assert portal.deployment_status("demo") == "pending"

        # A second `demo_tenant` (the next `make up` runs it again) reuses the demo: no new
        # model, version or key (nor trains again).
        again = subprocess.run(
            [str(REPO / ".venv" / "bin" / "python"), "manage.py", "demo_tenant"],
            cwd=REPO,
            env=portal.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0, again.stdout + again.stderr
        assert "Demo deployment 'demo' exists (status pending)" in again.stdout, again.stdout
        assert "inference key:" not in again.stdout
        assert "Training the demo" not in again.stdout
        # v1 and v2 of the trained model; the deployment's key and the traffic part's.
        assert portal.row_counts() == {
            "model": 1, "version": 2, "deployment": 1, "key": 2, "drill": 1,
        }  # fmt: skip

        output = portal.ctrl_c(STOP_TIMEOUT)  # Ctrl-C in the terminal
        assert "[up] stopped (exit 0)" in output, output
        assert "--- Logging error ---" not in output, output  # e.g. a filter breaking a handler
        assert "Traceback" not in output, output
        assert not _listening(portal.port), "the web server still listens"
        assert not _listening(portal.pg_port) and not _listening(portal.redis_port)
        left = {name: pid for name, pid in parts.items() if _alive(pid)}
        assert not left, f"parts still running after stop: {left}"
        assert not _pids_with_env(portal.env_marker), "processes of this portal are left"
    finally:
        portal.close()


@pytest.mark.ray
def test_make_up_with_the_local_ray_head_serves_the_demo_deployment(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    web, *ray_ports = free_ports(8)
    names = ("GCS", "DASHBOARD", "SERVE", "CLIENT", "AGENT")
    names += ("AUTOSCALER_METRICS", "DASHBOARD_METRICS")
    env = {
        f"PORTAL_RAY_{name}_PORT": str(port) for name, port in zip(names, ray_ports, strict=True)
    }
    env["PORTAL_RAY_NUM_GPUS"] = "0"
    env["PORTAL_UP_VERBOSE"] = "1"  # every part's lines on the terminal, as `make up VERBOSE=1`
    gcs, dashboard, serve = ray_ports[:3]
    started = time.monotonic()
    portal = Portal(tmp_path, port=web, env=env)
    head = LocalHeadConfig(data_dir=portal.data_dir)  # where it keeps its state and temp dir
    try:
        portal.wait_until_up(START_TIMEOUT)
        output = portal.output
        parts = portal.started_parts()
        # The embedded servers first, then the head, then the rest.
        assert list(parts) == [
            "postgres",
            "valkey",
            "ray",
            "web",
            "gpu-agent",
            "worker",
            "worker-health",
            "worker-validation",
            "worker-checks",
            "traffic",
            "beat",
        ], output
        assert f"Serve proxy on http://127.0.0.1:{serve}/" in output, output

        slug, _, _ = _demo_login(output)
        key, url = _demo_deployment(output)
        assert url == f"http://127.0.0.1:{serve}/{slug}/demo/v1/completions"

        # The worker's reconcile puts the demo on Serve; the replica loads the tiny model.
        last: Any = None
        while time.monotonic() - started < RAY_SERVE_TIMEOUT:
            try:
                status, body = _complete(url, key)
            except OSError as exc:  # the proxy starts with the first applied config
                status, body = 0, {"error": str(exc)}
            if status == 200:
                break
            last = (status, body)
            time.sleep(1)
        else:
            pytest.fail(
                f"no completion in {RAY_SERVE_TIMEOUT:.0f}s (last {last}):\n{portal.output}"
            )
        assert body["object"] == "text_completion"
        assert isinstance(body["choices"][0]["text"], str)
        assert body["usage"]["completion_tokens"] == 8
        assert _complete(url, "ik_not-a-key")[0] == 401

        # The beat's status refresh (or the reconcile's follow-up) marks it running.
        deadline = time.monotonic() + 30
        while portal.deployment_status("demo") != "running" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert portal.deployment_status("demo") == "running"

        # The embedded default runs the whole ops loop: health ticks store the demo's SLIs
        # (the replicas publish them to the embedded Valkey), so its health page has charts.
        sli_rows = (
            "SELECT COUNT(*) FROM serving_slisample s "
            "JOIN serving_deployment d ON d.id = s.deployment_id WHERE d.name = 'demo'"
        )
        deadline = time.monotonic() + 45
        while portal.query(sli_rows)[0][0] == 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert portal.query(sli_rows)[0][0] > 0, portal.part_log("worker-health")[-3000:]
        # The demo model answers in English (trained at first run), and the story plays.
        assert re.fullmatch(r"[A-Za-z ,.!':-]*", body["choices"][0]["text"]), body
        _, email, password = _demo_login(output)
        _drill_story(f"http://127.0.0.1:{web}", slug, email, password, portal)

        # Every listener of the head (replicas' gRPC servers included) and of the portal's
        # own processes is on loopback.
        state = HeadState.read(head.state_path)
        assert state is not None, "the head recorded no state"
        ray_procs = head_processes(state)
        ray_pids = {p.pid for p in ray_procs}
        listeners = listening_sockets(ray_pids | set(_pids_with_env(portal.env_marker)))
        exposed = [item for item in listeners if not item.loopback]
        assert not exposed, f"listeners off loopback: {exposed}"
        assert set(ray_ports) <= {item.port for item in listeners}, listeners
        replicas = {p.pid for p in ray_procs if p.name.startswith("ray::ServeRepli")}
        assert replicas, [p.name for p in ray_procs]
        assert {item.pid for item in listeners} & replicas, "no replica listener was checked"

        output = portal.ctrl_c(RAY_STOP_TIMEOUT)
        assert "[up] stopped (exit 0)" in output, output
        assert "--- Logging error ---" not in output, output
        # The head stops last, after the other parts.
        stopping = output.index("[up] stopping")
        assert output.index('"stopped": [', stopping) > output.index("[web] INFO:     Finished")
        left = {name: pid for name, pid in parts.items() if _alive(pid)}
        assert not left, f"parts still running after stop: {left}"
        assert not [pid for pid in ray_pids if _alive(pid)], "Ray processes are left"
        assert not _pids_with_env(portal.env_marker), "processes of this portal are left"
        assert not head.state_path.exists()
        assert not [port for port in (web, *ray_ports) if _listening(port)]
    finally:
        portal.close(RAY_STOP_TIMEOUT)
        if not head.temp_dir.is_relative_to(portal.data_dir):  # a short one under /tmp
            shutil.rmtree(head.temp_dir, ignore_errors=True)
