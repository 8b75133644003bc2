"""The local Ray head and the Serve REST API client, on a real cluster (tests marked `ray`).

Loopback-only listeners, token auth on the dashboard, deploys through PUT with a user_config
that reconfigures live replicas (no restart), a change that does restart them, DELETE, and
Serve's own message when a config is bad. A few quick tests of the target/env parsing first.
"""

from __future__ import annotations

import copy
import shutil
import socket
import subprocess
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from serving.control.cluster import (
    ClusterConfigError,
    Listener,
    LocalHeadConfig,
    decode_address,
    ensure_token,
    listening_sockets,
    ray_target_from_env,
)
from serving.control.serve_api import (
    AppStatus,
    ServeApiClient,
    ServeApiError,
    ServeDeployFailed,
)
from tests.ray_cluster import RayCluster

APP = "echo"
ROUTE = "/echo"
BASELINE: dict[str, Any] = {
    # No http_options on purpose: the client fills in the target's (127.0.0.1, its port).
    "applications": [
        {
            "name": APP,
            "route_prefix": ROUTE,
            "import_path": "tests.serving.serve_echo_app:app",
            "deployments": [
                {
                    "name": "Echo",
                    "num_replicas": 2,
                    "user_config": {"value": 1},
                    # Fractional CPUs: two replicas and a rolling replacement fit the 2-CPU head.
                    "ray_actor_options": {"num_cpus": 0.25},
                }
            ],
        }
    ]
}


def deployed_config(client: ServeApiClient) -> dict[str, Any]:
    """The config Serve runs now, as a PUT body (tests change one field of it at a time)."""
    apps = client.details()["applications"]
    return {"applications": [copy.deepcopy(apps[APP]["deployed_app_config"])]}


def echo_deployment(config: dict[str, Any]) -> dict[str, Any]:
    deployment: dict[str, Any] = config["applications"][0]["deployments"][0]
    return deployment


def running_replicas(client: ServeApiClient) -> dict[int, str]:
    """pid -> replica id of the RUNNING replicas."""
    return {
        r.pid: r.replica_id for r in client.replicas(APP, "Echo") if r.state == "RUNNING" and r.pid
    }


def served(
    cluster: RayCluster, replicas: int, *, value: Any = None, timeout: float = 15.0
) -> dict[int, Any]:
    """Call the app through the proxy until `replicas` pids answered (with `value`, if given)."""
    seen: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = cluster.get(ROUTE)
        seen[body["pid"]] = body["value"]
        if len(seen) >= replicas and (value is None or all(v == value for v in seen.values())):
            return seen
        time.sleep(0.02)
    raise AssertionError(f"wanted {replicas} replicas serving {value!r}, saw {seen}")


def test_without_ray_address_the_target_is_the_local_head(settings: Any, tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path
    target = ray_target_from_env({"PORTAL_RAY_SERVE_PORT": "8101"})
    assert target.managed and target.local_head is not None
    assert target.address == "127.0.0.1:6390"
    assert target.dashboard_url == "http://127.0.0.1:8265"
    assert target.serve_url == "http://127.0.0.1:8101"
    assert target.serve_http_options == {"host": "127.0.0.1", "port": 8101}
    token_path = target.local_head.token_path
    assert token_path.is_relative_to(tmp_path) and token_path.stat().st_mode & 0o777 == 0o600
    assert ray_target_from_env({}).token == target.token  # generated once, then reused
    assert target.token not in repr(target)


def test_ray_address_names_an_existing_cluster() -> None:
    env = {
        "RAY_ADDRESS": "10.1.2.3:6379",
        "RAY_DASHBOARD_URL": "http://10.1.2.3:8265/",
        "RAY_AUTH_TOKEN": "s3cret",
        "RAY_SERVE_URL": "http://10.1.2.3:9000",
    }
    target = ray_target_from_env(env)
    assert not target.managed
    assert (target.dashboard_url, target.serve_url, target.token) == (
        "http://10.1.2.3:8265",
        "http://10.1.2.3:9000",
        "s3cret",
    )
    # A remote cluster's proxies listen on every address (one bound to loopback on another
    # host answers no one), unless PORTAL_RAY_SERVE_HOST says otherwise; a proxy per node.
    assert target.serve_http_options == {"port": 9000, "host": "0.0.0.0"}  # noqa: S104
    assert (target.proxy_location, dict(target.replica_resources)) == ("EveryNode", {})
    chosen = ray_target_from_env({
        **env, "PORTAL_RAY_SERVE_HOST": "10.1.2.3", "PORTAL_RAY_PROXY_LOCATION": "HeadOnly",
        "PORTAL_RAY_REPLICA_RESOURCES": '{"portal-worker": 0.001}',
    })  # fmt: skip
    assert chosen.serve_http_options == {"port": 9000, "host": "10.1.2.3"}
    assert chosen.proxy_location == "HeadOnly"
    assert dict(chosen.replica_resources) == {"portal-worker": 0.001}
    for name, value, why in [
        ("PORTAL_RAY_PROXY_LOCATION", "Everywhere", "must be one of EveryNode"),
        ("PORTAL_RAY_REPLICA_RESOURCES", "{not json", "is not JSON"),
        ("PORTAL_RAY_REPLICA_RESOURCES", '{"w": -1}', "positive amounts"),
        ("PORTAL_RAY_REPLICA_RESOURCES", '["w"]', "JSON object"),
        ("PORTAL_RAY_REPLICA_RESOURCES", '{"CPU": 1}', "custom resources only"),
    ]:
        with pytest.raises(ClusterConfigError, match=why):
            ray_target_from_env({**env, name: value})
    with pytest.raises(ClusterConfigError, match="RAY_AUTH_TOKEN"):
        ray_target_from_env({k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN"})
    with pytest.raises(ClusterConfigError, match="PORTAL_RAY_GCS_PORT"):
        ray_target_from_env({"PORTAL_RAY_GCS_PORT": "many"})


def test_a_long_data_dir_gets_a_short_temp_dir_for_ray_sockets(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60)
    temp_dir = LocalHeadConfig(data_dir=deep).temp_dir
    assert len(str(temp_dir)) <= 40 and not temp_dir.is_relative_to(deep)
    assert LocalHeadConfig(data_dir=deep).temp_dir == temp_dir  # stable for the same data dir
    assert LocalHeadConfig(data_dir=Path("/srv/p")).temp_dir == Path("/srv/p/ray/tmp")


def test_proc_net_addresses_and_what_counts_as_loopback() -> None:
    assert decode_address("0100007F") == "127.0.0.1"
    assert decode_address("0000000000000000FFFF00000100007F") == "::ffff:127.0.0.1"
    assert decode_address("00000000000000000000000001000000") == "::1"
    assert Listener(1, "::ffff:127.0.0.1", 1).loopback and Listener(1, "::1", 1).loopback
    assert not Listener(1, "::", 1).loopback
    assert not Listener(1, "0.0.0.0", 1).loopback  # noqa: S104 (a parsed address, not a bind)
    assert not Listener(1, "192.0.2.7", 1).loopback


@pytest.fixture
def echo_app(ray_cluster: RayCluster) -> ServeApiClient:
    """The echo app RUNNING (deployed once, then reused as later tests left it)."""
    client = ray_cluster.client()
    current = client.applications().get(APP)
    if current is None or current.status is not AppStatus.RUNNING:
        client.put(BASELINE)
        client.wait_until([APP], timeout=90)
    return client


@pytest.mark.ray
def test_every_listener_of_the_cluster_is_loopback(
    ray_cluster: RayCluster, echo_app: ServeApiClient
) -> None:
    pids = ray_cluster.pids()
    replica_pids = set(running_replicas(echo_app))
    assert replica_pids and replica_pids <= pids, "replicas must belong to the head's session"

    listeners = listening_sockets(pids)
    ports = {item.port for item in listeners}
    assert set(ray_cluster.config.fixed_ports().values()) <= ports  # GCS, dashboard, Serve, ...
    exposed = [item for item in listeners if not item.loopback]
    assert not exposed, f"Ray listens beyond loopback: {exposed}"

    if shutil.which("ss"):  # the same check the way an operator makes it
        out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
        ours = [line for line in out.splitlines() if any(f"pid={pid}," in line for pid in pids)]
        assert ours
        for line in ours:
            local = line.split()[3]
            host = local.rsplit(":", 1)[0].strip("[]")
            assert host.removeprefix("::ffff:") == "127.0.0.1" or host == "::1", line


@pytest.mark.ray
def test_the_dashboard_refuses_requests_without_the_token(ray_cluster: RayCluster) -> None:
    good = ray_cluster.client()
    assert "applications" in good.details()

    with pytest.raises(ServeApiError) as missing:
        good.request("GET", "/api/serve/applications/", authenticated=False)
    assert missing.value.status == 401
    assert "Missing authentication token" in missing.value.serve_message

    with pytest.raises(ServeApiError) as wrong:
        ServeApiClient(ray_cluster.dashboard_url, "0" * 64).details()
    assert wrong.value.status == 403

    with pytest.raises(ServeApiError) as put_without:
        good.request("PUT", "/api/serve/applications/", BASELINE, authenticated=False)
    assert put_without.value.status == 401

    token_path = ray_cluster.config.token_path
    assert token_path.stat().st_mode & 0o777 == 0o600
    assert ensure_token(token_path) == ray_cluster.token  # a restart reuses the same token


@pytest.mark.ray
def test_a_user_config_change_reconfigures_live_replicas(
    ray_cluster: RayCluster, echo_app: ServeApiClient
) -> None:
    config = deployed_config(echo_app)
    replicas = echo_deployment(config)["num_replicas"]
    old_value = echo_deployment(config)["user_config"]["value"]
    before = running_replicas(echo_app)
    assert set(served(ray_cluster, replicas, value=old_value)) == set(before)
    deployed_at = echo_app.applications()[APP].last_deployed_time_s

    new_value = old_value + 1
    echo_deployment(config)["user_config"] = {"value": new_value}
    started = time.perf_counter()
    echo_app.put(config)
    answers = served(ray_cluster, replicas, value=new_value, timeout=10)
    served_after = time.perf_counter() - started
    echo_app.wait_until([APP], deployed_after=deployed_at, timeout=30)
    running_after = time.perf_counter() - started
    print(
        f"\nuser_config reconfigure: new value served by all {replicas} replicas after "
        f"{served_after:.2f}s, app RUNNING after {running_after:.2f}s"
    )

    assert set(answers) == set(before), "the same processes serve the new value"
    assert running_replicas(echo_app) == before, "same replica ids and pids: nothing restarted"
    assert served_after < 5


@pytest.mark.ray
def test_a_change_outside_user_config_replaces_the_replicas(
    ray_cluster: RayCluster, echo_app: ServeApiClient
) -> None:
    config = deployed_config(echo_app)
    deployment = echo_deployment(config)
    before = running_replicas(echo_app)
    deployed_at = echo_app.applications()[APP].last_deployed_time_s

    # ray_actor_options belong to the replica actor itself: Serve rolls new actors.
    cpus = deployment["ray_actor_options"]["num_cpus"]
    deployment["ray_actor_options"] = {"num_cpus": 0.2 if cpus == 0.25 else 0.25}
    started = time.perf_counter()
    echo_app.put(config)
    echo_app.wait_until([APP], deployed_after=deployed_at, timeout=60)
    after = running_replicas(echo_app)
    print(
        f"\nray_actor_options change: replicas replaced, RUNNING after {time.perf_counter() - started:.2f}s"
    )
    assert len(after) == deployment["num_replicas"]
    assert not set(after.values()) & set(before.values()), "every replica is a new actor"
    assert not set(after) & set(before), "in new processes"
    value = deployment["user_config"]["value"]
    assert set(served(ray_cluster, len(after), value=value)) == set(after)

    # num_replicas only adds (or removes) actors; the ones that stay keep running untouched.
    deployed_at = echo_app.applications()[APP].last_deployed_time_s
    deployment["num_replicas"] = len(after) + 1
    started = time.perf_counter()
    echo_app.put(config)
    echo_app.wait_until([APP], deployed_after=deployed_at, timeout=60)
    scaled = running_replicas(echo_app)
    print(
        f"num_replicas {len(after)} -> {len(scaled)}: RUNNING after {time.perf_counter() - started:.2f}s"
    )
    assert len(scaled) == len(after) + 1
    assert set(after.items()) <= set(scaled.items()), "existing replicas were not restarted"


@pytest.mark.ray
def test_delete_removes_the_applications_and_their_replicas(
    ray_cluster: RayCluster, echo_app: ServeApiClient
) -> None:
    replica_pids = set(running_replicas(echo_app))
    assert replica_pids

    echo_app.delete()
    assert (
        echo_app.wait_until([APP], [AppStatus.ABSENT], timeout=10)[APP].status is AppStatus.ABSENT
    )
    assert echo_app.details()["applications"] == {}
    deadline = time.monotonic() + 20
    while replica_pids & ray_cluster.pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not replica_pids & ray_cluster.pids(), "replica processes are gone"
    with pytest.raises(urllib.error.URLError):  # DELETE shuts Serve down, proxy included
        ray_cluster.get(ROUTE)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", ray_cluster.config.serve_port)) != 0


@pytest.mark.ray
def test_a_config_serve_rejects_raises_with_serve_message(ray_cluster: RayCluster) -> None:
    client = ray_cluster.client()
    with pytest.raises(ServeApiError) as invalid:
        client.put({"applications": [{"name": "bad", "route_prefix": "/bad"}]})
    assert invalid.value.status == 400
    assert "import_path" in invalid.value.serve_message  # pydantic names the missing field
    assert "import_path" in str(invalid.value)


@pytest.mark.ray
def test_an_app_that_cannot_be_imported_reports_deploy_failed(ray_cluster: RayCluster) -> None:
    client = ray_cluster.client()
    config = copy.deepcopy(BASELINE)
    config["applications"][0]["import_path"] = "tests.serving.no_such_module:app"
    client.put(config)
    try:
        with pytest.raises(ServeDeployFailed) as failed:
            client.wait_until([APP], timeout=60)
        assert failed.value.apps[APP].status is AppStatus.DEPLOY_FAILED
        assert "No module named 'tests.serving.no_such_module'" in failed.value.serve_message
    finally:
        client.delete()
