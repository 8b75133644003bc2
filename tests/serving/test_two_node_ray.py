"""A real two-node Ray cluster: the session's head and a second raylet that cannot see the
portal's files (tests.ray_nodes). A deployment's replicas land on the second node (the
replica resources its operator gives worker nodes), fetch their version's files from the
portal by a signed URL (ARTIFACT_DELIVERY=portal), checksum and cache them on the node, and
answer through the head's proxy and through the node's own (proxy_location EveryNode). With
the portal's OTLP settings handed on, the replica exports one inference's spans (router ->
version -> queue, prefill, decode) continuing the client's traceparent."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.deployments import reconcile as control
from serving.deployments.models import Deployment, DeploymentStatus
from serving.engine.checkpoint import directory_sha256
from serving.registry import delivery
from tests.ray_cluster import RayCluster, remove_apps
from tests.ray_nodes import OtlpReceiver, listeners, loopback_only, second_node, sees
from tests.serving.test_serving_ray import _key, _post, published_window
from tests.support.worlds import make_world, world_checkpoint

pytestmark = [pytest.mark.ray, pytest.mark.django_db(transaction=True)]

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


def _rate(http: httpx.Client, url: str, key: str, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        assert _post(http, url, key, max_tokens=8).status_code == 200
    return n / (time.perf_counter() - started)


def test_replicas_on_a_second_node_fetch_their_files_from_the_portal(
    ray_cluster: RayCluster,
    live_server: Any,
    settings: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings.ARTIFACT_STORE_DIR = tmp_path / "store"
    settings.ARTIFACT_STORE_DIR.mkdir()
    settings.ARTIFACT_DELIVERY = "portal"
    settings.PORTAL_INTERNAL_URL = live_server.url
    settings.CLUSTER_CAPACITY = False
    world = make_world("Acme")
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    version = deployment.current_revision.stable_version
    checkpoint = world_checkpoint()
    app = deployment.serve_app
    key = _key(world, deployment)  # before the reconcile that hands the routers its hash
    # Traces on: the replicas export to a receiver here (the portal hands its OTEL_* on).
    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    with second_node(
        ray_cluster, resources={"worker-node": 100}, hide=[checkpoint.parent, tmp_path / "store"]
    ) as node:
        target = dataclasses.replace(ray_cluster.target, replica_resources={"worker-node": 1})
        client = ray_cluster.client()
        started = time.monotonic()
        control.reconcile(target=target, client=client)
        client.wait_until([app], timeout=180)
        ready_s = time.monotonic() - started
        control.refresh_status(client=client)
        deployment.refresh_from_db()
        assert deployment.status == DeploymentStatus.RUNNING, deployment.status_message

        # The second node listens on loopback only, like the head.
        bound = listeners(node.pids())
        assert loopback_only(bound), bound

        # Every replica is on the second node, where the portal's files are not to be seen.
        replicas = client.replicas(app)
        assert replicas and {r.node_id for r in replicas} == {node.node_id}
        for replica in replicas:
            assert replica.pid and not sees(replica.pid, checkpoint)
        assert sees(next(iter(ray_cluster.pids())), checkpoint)  # the head's processes do

        # The replica fetched the tar from the portal, checksummed it, and cached it.
        window = published_window(app, "stable", lambda w: w["kv"].get("artifact_fetch"))
        fetched = window["kv"]["artifact_fetch"]
        size = delivery.tar_size(delivery.tar_entries(checkpoint))
        assert fetched["via"] == "portal" and fetched["cached"] is False
        assert fetched["bytes"] == size and fetched["sha256"] == version.sha256
        assert directory_sha256(node.cache_dir / version.sha256) == version.sha256
        assert (node.cache_dir / f"{version.sha256}.ok").exists()

        url = "/acme/assistant/v1/completions"
        with httpx.Client(timeout=30, trust_env=False) as http:
            for base in (ray_cluster.serve_url, node.proxy_url):  # both proxies route to it
                assert _post(http, base + url, key).status_code == 200
            # One inference's trace, exported by the replica on the second node: the router
            # continues the client's traceparent, the version the router's, then the engine.
            traced = http.post(
                ray_cluster.serve_url + url,
                json={"prompt": "One trace, please.", "max_tokens": 4, "temperature": 0},
                headers={"authorization": f"Bearer {key}", "traceparent": TRACEPARENT},
            )
            assert traced.status_code == 200
            tree = receiver.trace(TRACE_ID, {"router", "version", "queue", "prefill", "decode"})
            assert tree["router"]["parent"] == CLIENT_SPAN
            assert tree["router"]["service"] == "portal-dataplane"
            assert tree["version"]["parent"] == tree["router"]["span_id"]
            for phase in ("queue", "prefill", "decode"):
                assert tree[phase]["parent"] == tree["version"]["span_id"]
            head_rps = _rate(http, ray_cluster.serve_url + url, key, 30)
            node_rps = _rate(http, node.proxy_url + url, key, 30)
        with capsys.disabled():
            print(
                f"\n[two-node] deploy to ready {ready_s:.1f} s; artifact {size} bytes in "
                f"{fetched['s']:.3f} s ({size / max(fetched['s'], 1e-6) / 1e6:.1f} MB/s); "
                f"head proxy {head_rps:.1f} req/s, node proxy {node_rps:.1f} req/s "
                f"({node_rps / head_rps:.2f}x)"
            )
        remove_apps(ray_cluster)  # before the node stops: its replicas stop cleanly
    receiver.close()
