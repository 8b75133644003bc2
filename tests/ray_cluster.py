"""One local Ray head for the whole test session (tests marked `ray`), on random loopback ports.

It is started and stopped by the same code the portal uses (serving.control.cluster), in a temp
data dir with its own token, and stopped by PID at the end; a leftover process fails the run.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from serving.control.cluster import (
    LOOPBACK,
    HeadState,
    LocalHeadConfig,
    RayTarget,
    head_processes,
    local_target,
    start_head,
    stop_head,
)
from serving.control.serve_api import ServeApiClient

# Redis and the portal own these; Ray hands 10002-19999 to its workers and refuses overlaps.
_RESERVED_PORTS = {6379, 8000}
_WORKER_PORT_RANGE = range(10002, 20000)


def free_ports(count: int) -> list[int]:
    """Distinct free ports on 127.0.0.1 (all held open together, so none repeats)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            held.append(sock)
            port = sock.getsockname()[1]
            if port not in _RESERVED_PORTS and port not in _WORKER_PORT_RANGE:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


@dataclass(frozen=True)
class RayCluster:
    config: LocalHeadConfig
    target: RayTarget
    state: HeadState

    @property
    def dashboard_url(self) -> str:
        return self.target.dashboard_url

    @property
    def serve_url(self) -> str:
        return self.target.serve_url

    @property
    def token(self) -> str:
        return self.target.token

    def portal_env(self) -> dict[str, str]:
        """The environment that points the portal (ray_target_from_env) at this cluster."""
        return {
            "RAY_ADDRESS": self.target.address,
            "RAY_DASHBOARD_URL": self.dashboard_url,
            "RAY_AUTH_TOKEN": self.token,
            "RAY_SERVE_URL": self.serve_url,
            "PORTAL_RAY_SERVE_HOST": "127.0.0.1",
        }

    def client(self, *, timeout: float = 15.0) -> ServeApiClient:
        return ServeApiClient.from_target(self.target, timeout=timeout)

    def pids(self) -> set[int]:
        return {p.pid for p in head_processes(self.state)}

    def get(self, path: str) -> Any:
        """GET a JSON route on the Serve proxy (loopback; environment proxies bypassed)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.serve_url + path, timeout=10) as resp:
            return json.loads(resp.read())


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    gcs, dashboard, serve, client_server, agent, autoscaler_metrics, dashboard_metrics = free_ports(
        7
    )
    config = LocalHeadConfig(
        data_dir=tmp_path_factory.mktemp("ray-head"),
        gcs_port=gcs,
        dashboard_port=dashboard,
        serve_port=serve,
        client_server_port=client_server,
        dashboard_agent_port=agent,
        autoscaler_metrics_port=autoscaler_metrics,
        dashboard_metrics_port=dashboard_metrics,
        num_cpus=2,
        num_gpus=0,
    )
    state = start_head(config)
    try:
        yield RayCluster(config=config, target=local_target(config), state=state)
    finally:
        stop_head(config)
        leftover = head_processes(state)
        with contextlib.suppress(OSError):
            if not config.temp_dir.is_relative_to(config.data_dir):
                shutil.rmtree(config.temp_dir, ignore_errors=True)
        assert not leftover, f"Ray processes left behind: {leftover}"


@pytest.fixture(autouse=True)
def _serve_apps_removed_after_ray_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """A Ray test's applications leave with it: live replicas would otherwise keep publishing
    SLI values under app names (`acme.assistant`) that later tests' worlds use again."""
    yield
    if "ray_cluster" not in request.fixturenames:
        return
    remove_apps(request.getfixturevalue("ray_cluster"))


def remove_apps(cluster: RayCluster) -> None:
    """Delete every Serve application of the cluster and wait until they are gone."""
    client = cluster.client()
    names = list(client.applications())
    if names:
        client.put({
            "proxy_location": cluster.target.proxy_location,
            "http_options": dict(cluster.target.serve_http_options),
            "applications": [],
        })  # fmt: skip
        client.wait_until(names, ["ABSENT"], timeout=90)
