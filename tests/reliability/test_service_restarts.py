"""Redis, then PostgreSQL, restarted under load. The portal (web server, Celery worker, GPU
agent) runs as real processes against its OWN PostgreSQL and Redis, started here on free
loopback ports (the machine's shared services are never touched). While each restarts:

* pages and the API keep answering, or fail clearly (503 naming the dependency), never hang;
* the live GPU stream resumes within 5 s of the service being back;
* no incident, rollback or audit row written before is lost, and everything works after.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ray_cluster import free_ports
from tests.test_make_up import _demo_login, _get, _log_in

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), None)
RESUME_S = 5.0


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: drop to its own user where we are root."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class OwnServices:
    """A throwaway PostgreSQL cluster and Redis server, on free loopback ports."""

    def __init__(self, tmp: Path) -> None:
        self.pg_port, self.redis_port = free_ports(2)
        # Outside pytest's tmp dir (mode 0700, root's): the postgres user must reach it.
        self.pg_dir = Path(tempfile.mkdtemp(prefix="portal-test-pg-"))
        self.pg_dir.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.pg_dir, "postgres", "postgres")
        self.redis: subprocess.Popen[bytes] | None = None
        self.log = (tmp / "services.log").open("ab")

    def start_postgres(self, init: bool = False) -> None:
        assert PG_BIN is not None
        if init:
            subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(self.pg_dir / "data"),
                                         "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
                           check=True, stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        subprocess.run(_as_postgres([
            str(PG_BIN / "pg_ctl"), "-D", str(self.pg_dir / "data"), "-w", "-l",
            str(self.pg_dir / "server.log"), "-o",
            f"-p {self.pg_port} -k {self.pg_dir} -c listen_addresses=127.0.0.1", "start",
        ]), check=True, stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip

    def stop_postgres(self) -> None:
        assert PG_BIN is not None
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.pg_dir / "data"),
                                     "-m", "fast", "-w", "stop"]),
                       check=False, stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip

    def remove(self) -> None:
        shutil.rmtree(self.pg_dir, ignore_errors=True)
        self.log.close()

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(self.redis_port), "ping"],
                             capture_output=True).stdout.strip() != b"PONG":  # fmt: skip
            assert time.monotonic() < deadline, "redis did not start"
            time.sleep(0.1)

    def stop_redis(self) -> None:
        if self.redis is not None:
            self.redis.terminate()
            self.redis.wait(timeout=10)
            self.redis = None

    @property
    def env(self) -> dict[str, str]:
        return {
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:{self.pg_port}/postgres",
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
        }


class Portal:
    """web + worker + GPU agent (simulated), as `manage.py up` would run them."""

    def __init__(self, tmp: Path, services: OwnServices) -> None:
        self.port = free_ports(1)[0]
        self.base = f"http://127.0.0.1:{self.port}"
        dropped = ("DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE", "PORTAL_RAY",
                   "RAY_ADDRESS")  # fmt: skip
        self.env = {k: v for k, v in os.environ.items() if k not in dropped} | services.env | {
            "PORTAL_DATA_DIR": str(tmp / "data"), "PORTAL_RAY": "off",
            "GPU_AGENT_SIMULATE": "1", "CELERY_TASK_ALWAYS_EAGER": "", "DEBUG": "false",
        }  # fmt: skip
        self.log = (tmp / "portal.log").open("ab")
        self.processes: list[subprocess.Popen[bytes]] = []

    def manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def start(self) -> None:
        for argv in (
            [sys.executable, "-m", "portal.serve", "--port", str(self.port)],
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q",
             "default,health,chaos", "--concurrency", "1", "--pool", "solo",
             "--without-gossip", "--without-mingle"],
            [sys.executable, "manage.py", "gpu_agent", "--node", "restart-node"],
        ):  # fmt: skip
            self.processes.append(
                subprocess.Popen(
                    argv, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT
                )
            )
        deadline = time.monotonic() + 120
        while True:
            try:
                if _get(f"{self.base}/healthz")[0] == 200:
                    return
            except OSError:  # refused, reset or timed out while it starts
                pass
            assert time.monotonic() < deadline, "the portal did not come up"
            time.sleep(0.3)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.log.close()


class Load:
    """Pages, API and /healthz requested in a loop; every answer's status (or 'error')."""

    def __init__(self, urls: list[str], opener: Any) -> None:
        self.urls, self.opener = urls, opener
        self.statuses: Counter[str] = Counter()
        self.odd: list[tuple[str, int, str]] = []  # answers neither 200 nor a clear 503
        self.slow: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for url in self.urls:
                started = time.monotonic()
                try:
                    with self.opener.open(url, timeout=10) as response:
                        self.statuses[str(response.status)] += 1
                except urllib.error.HTTPError as exc:
                    body = exc.read().decode(errors="replace")
                    clear = exc.code == 503 and "unavailable" in body
                    self.statuses[f"{exc.code}{' clear' if clear else ''}"] += 1
                    if not clear:
                        self.odd.append((url, exc.code, body[:300]))
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    self.statuses["error"] += 1
                elapsed = time.monotonic() - started
                if elapsed > 5:
                    self.slow.append(elapsed)
            time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


class Stream:
    """A browser's GPU stream: reconnects (with `since`) whenever the socket drops."""

    def __init__(self, url: str, cookie: str, origin: str) -> None:
        self.url, self.cookie, self.origin = url, cookie, origin
        self.samples: list[tuple[float, str]] = []  # (received at, seq)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        import websockets

        while not self.stop.is_set():
            since = f"&since={self.samples[-1][1]}" if self.samples else ""
            try:
                async with websockets.connect(
                    self.url + since, additional_headers={"Cookie": self.cookie},
                    origin=self.origin, open_timeout=5,
                ) as ws:  # fmt: skip
                    while not self.stop.is_set():
                        try:
                            message = await asyncio.wait_for(ws.recv(), timeout=1)
                        except TimeoutError:
                            continue
                        self.samples.append((time.monotonic(), json.loads(message)["seq"]))
            except Exception:  # noqa: BLE001 (any drop: reconnect, as the page does)
                await asyncio.sleep(0.5)

    def first_after(self, moment: float) -> float | None:
        later = [at for at, _ in self.samples if at > moment]
        return later[0] - moment if later else None

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[OwnServices]:
    if PG_BIN is None or shutil.which("redis-server") is None:
        pytest.fail("PostgreSQL server binaries and redis-server are needed (.ci/ensure-services)")
    own = OwnServices(tmp_path)
    own.start_postgres(init=True)
    own.start_redis()
    try:
        yield own
    finally:
        own.stop_redis()
        own.stop_postgres()
        own.remove()


def _counts(portal: Portal) -> dict[str, int]:
    script = (
        "import json; from incidents.models import Incident; from serving.models import "
        "Rollback; from tenants.models import AuditEvent; print(json.dumps({'incidents': "
        "Incident.objects.count(), 'rollbacks': Rollback.objects.count(), 'audit': "
        "AuditEvent.objects.count()}))"
    )
    return json.loads(portal.manage("shell", "-c", script).strip().splitlines()[-1])


def test_redis_then_postgres_restart_under_load(services: OwnServices, tmp_path: Path) -> None:
    portal = Portal(tmp_path, services)
    portal.manage("migrate", "--noinput", "-v", "0")
    slug, email, password = _demo_login(portal.manage("demo_tenant"))
    # History that must survive: an incident (a drill breach) and a finished rollback.
    portal.manage("shell", "-c", (
        "from django.utils import timezone; from incidents import services; "
        "from serving.models import Deployment, Rollback; "
        "d = Deployment.objects.get(name='demo'); r = d.current_revision; "
        "services.breach_record(tenant=d.tenant, deployment=d, group='stable', "
        "objective='availability', kind='burn', severity='page', action='notify', "
        "detail='restart test', observed={}, detected_at=timezone.now()); "
        "Rollback.objects.create(tenant=d.tenant, deployment=d, key='restart-test', "
        "trigger='manual', from_revision=r, to_revision=r, status='done', "
        "detected_at=timezone.now(), started_at=timezone.now(), finished_at=timezone.now()); "
        # Serving (no Ray here): the simulated GPU hosts it, so the tenant's stream has samples.
        "Deployment.objects.filter(pk=d.pk).update(status='running')"
    ))  # fmt: skip
    before = _counts(portal)
    assert before["incidents"] == 1 and before["rollbacks"] == 1 and before["audit"] > 0
    portal.start()
    load = stream = None
    try:
        _, _, opener = _log_in(portal.base, email, password)
        jars = [h.cookiejar for h in opener.handlers if hasattr(h, "cookiejar")]
        cookie = "; ".join(f"{c.name}={c.value}" for jar in jars for c in jar)
        load = Load(
            [
                f"{portal.base}/t/{slug}/",
                f"{portal.base}/t/{slug}/incidents/",
                f"{portal.base}/api/v1/incidents/",
                f"{portal.base}/healthz",
            ],
            opener,
        )
        stream = Stream(f"ws://127.0.0.1:{portal.port}/ws/gpu/?tenant={slug}", cookie,
                        portal.base)  # fmt: skip
        deadline = time.monotonic() + 20
        while len(stream.samples) < 5:
            assert time.monotonic() < deadline, "no GPU samples before the restarts"
            time.sleep(0.2)

        services.stop_redis()
        time.sleep(3)
        services.start_redis()
        back = time.monotonic()
        time.sleep(RESUME_S + 1)
        resumed = stream.first_after(back)
        print(f"GPU stream resumed {resumed} s after Redis came back")
        assert resumed is not None and resumed <= RESUME_S, resumed

        services.stop_postgres()
        time.sleep(3)
        services.start_postgres()
        back = time.monotonic()
        time.sleep(RESUME_S + 1)
        resumed = stream.first_after(back)
        print(f"GPU stream resumed {resumed} s after PostgreSQL came back")
        assert resumed is not None and resumed <= RESUME_S, resumed
        assert _get(f"{portal.base}/healthz")[0] == 200
        status, _, page = _get(f"{portal.base}/t/{slug}/incidents/", opener)
        assert status == 200 and "availability" in page
    finally:
        if load is not None:
            load.close()
        if stream is not None:
            stream.close()
        portal.stop()
    statuses = load.statuses
    unclear = {s: n for s, n in statuses.items() if s not in ("200", "503 clear")}
    assert not unclear, (statuses, load.odd)
    assert statuses["200"] > 50 and not load.slow, (statuses, load.slow)
    assert _counts(portal) == before  # nothing written before the restarts was lost
    print("load:", dict(statuses), "samples:", len(stream.samples))  # noqa: T201 (-s shows it)
