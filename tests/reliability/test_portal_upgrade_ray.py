"""The upgrade procedure of docs/operations.md ("Upgrading the portal without stopping
inference"): with steady inference traffic through the Serve proxy, stop beat, the worker and
the web server, start them again (the new version), and check that no request failed, that no
replica restarted, and that the restarted control plane works (a change made through the new
web server's API reaches the data plane through the new worker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection

from serving.deployments import reconcile as control
from serving.deployments.models import Deployment
from tests.ray_cluster import RayCluster, free_ports
from tests.serving.test_ops_ray import ROOT, Traffic, Worker
from tests.serving.test_serving_ray import _key
from tests.support.worlds import make_world

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Process:
    """A portal process (web or beat) started the way production starts it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], tmp: Path) -> None:
        self.name, self.argv, self.env, self.tmp = name, argv, env, tmp
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Path:
        self.starts += 1
        log = self.tmp / f"{self.name}-{self.starts}.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(  # noqa: S603 (fixed argv)
                self.argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        return log

    def stop(self) -> None:
        """SIGTERM, as an orchestrator stops a pod: a graceful shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _env(cluster: RayCluster) -> dict[str, str]:
    db = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PORTAL_TEST_WORKER": "1",
        "PORTAL_TEST_RECONCILE": "1",  # the services' changes reconcile on commit
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        **cluster.portal_env(),
    }


def _ready(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url + "/readyz", timeout=5, trust_env=False)
            if response.status_code == 200:
                return
            last = response.text
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"{url}/readyz never answered 200: {last}")


@pytest.fixture
def processes(tmp_path: Path, ray_cluster: RayCluster) -> Iterator[dict[str, Any]]:
    env = _env(ray_cluster)
    (port,) = free_ports(1)
    web = Process("web", [sys.executable, "-m", "portal.serve", "--port", str(port)], env, tmp_path)
    beat = Process(
        "beat",
        [sys.executable, "-m", "celery", "-A", "portal", "beat", "-l", "INFO",
         "--pidfile", str(tmp_path / "beat.pid")],
        env, tmp_path,
    )  # fmt: skip
    worker = Worker(tmp_path, ray_cluster, ray_cluster.dashboard_url, reconcile=True)
    parts = {"web": web, "worker": worker, "beat": beat, "url": f"http://127.0.0.1:{port}"}
    try:
        yield parts
    finally:
        beat.stop()
        worker.stop()
        web.stop()


def test_restarting_web_worker_and_beat_under_traffic_fails_no_request(
    ray_cluster: RayCluster, processes: dict[str, Any]
) -> None:
    world = make_world("Acme")
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    key = _key(world, deployment)
    client = ray_cluster.client()
    control.reconcile(target=ray_cluster.target, client=client)
    client.wait_until([deployment.serve_app], timeout=120)
    replicas = {r.replica_id for r in client.replicas(deployment.serve_app)}
    web, worker, beat, url = (processes[k] for k in ("web", "worker", "beat", "url"))
    web.start()
    worker.start()
    beat.start()
    _ready(url)
    serve_url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    traffic = Traffic(serve_url, key, pause_s=0.05)
    try:
        time.sleep(2)
        # The upgrade: beat first (no new periodic work), then the worker (it finishes its
        # task: SIGTERM is Celery's warm shutdown), then the web server (uvicorn drains).
        beat.stop()
        worker.stop()
        web.stop()
        served_while_down = sum(traffic.statuses.values())
        time.sleep(2)  # the whole control plane is down: the data plane goes on
        web.start()
        worker.start()
        beat.start()
        _ready(url)
        # The new control plane works: a key made through the new web server's API reaches
        # the routers through the new worker's reconcile.
        with httpx.Client(base_url=url, trust_env=False, timeout=30) as api:
            made = api.post(
                f"/api/v1/deployments/{deployment.pk}/keys/", json={"name": "after"},
                headers={"authorization": f"Bearer {world.raw_token}"},
            )  # fmt: skip
        assert made.status_code == 201, made.text
        new_key = made.json()["key"]
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=30, trust_env=False) as http:
            while True:
                answer = http.post(
                    serve_url, json={"prompt": "hello", "max_tokens": 1},
                    headers={"authorization": f"Bearer {new_key}"},
                )  # fmt: skip
                if answer.status_code == 200:
                    break
                assert answer.status_code == 401, answer.text
                assert time.monotonic() < deadline, "the new key never reached the routers"
                time.sleep(0.5)
        time.sleep(2)
    finally:
        traffic.stop.set()
        traffic.thread.join(timeout=30)
    assert sum(traffic.statuses.values()) > served_while_down > 0
    assert traffic.failures == [], traffic.failures[:5]
    # No replica restarted: the restarted portal's reconciles changed only user_config.
    assert {r.replica_id for r in client.replicas(deployment.serve_app)} == replicas
