"""The ops loop for real: a local Ray cluster, a real Celery worker running the health ticks
and the rollbacks, traffic through the Serve proxy.

* A canary failing 30% of its requests at 20% traffic -> breach -> incident -> rollback ->
  100% on stable, inside a bounded loop.
* The worker killed with SIGKILL in the middle of a rollback (the Serve API answers slowly
  through a delaying proxy, so the kill lands between the revision and the reconcile) ->
  after a restart exactly one rollback exists, it is done, and traffic is on stable.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection

from incidents.models import Incident
from portal.celery import app as celery_app
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops.contracts import contract_set
from serving.ops.models import Rollback, RollbackStatus, Rollout
from serving.ops.tasks import health_tick
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_ops_loop import FAST_CONTRACT, _version

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]
PROMPT = "The quick brown fox"


class DelayingProxy:
    """A reverse proxy in front of the Ray dashboard that holds PUTs for `delay_s`: the Serve
    API answering slowly (what a control-plane delay looks like from the portal)."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "PUT":
                    proxy.held.set()
                    proxy.closed.wait(proxy.delay_s)
                    if proxy.closed.is_set():  # its sender is dead: never apply a stale config
                        self.send_error(503)
                        return
                request = urllib.request.Request(
                    upstream + self.path, data=body, method=self.command,
                    headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
                )  # fmt: skip
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                try:
                    with opener.open(request, timeout=60) as response:
                        status, payload, kind = response.status, response.read(), response.headers
                except urllib.error.HTTPError as exc:
                    status, payload, kind = exc.code, exc.read(), exc.headers
                self.send_response(status)
                self.send_header("content-type", kind.get("content-type", "application/json"))
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PUT = do_DELETE = do_POST = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.delay_s = delay_s
        self.held = threading.Event()
        self.closed = threading.Event()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


class Worker:
    def __init__(
        self,
        tmp: Path,
        cluster: RayCluster,
        dashboard_url: str,
        *,
        reconcile: bool = False,
        queues: str = "default,health",
        env: dict[str, str] | None = None,
    ) -> None:
        db = connection.settings_dict
        self.queues = queues
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PORTAL_TEST_WORKER": "1",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "RAY_ADDRESS": cluster.target.address,
            "RAY_DASHBOARD_URL": dashboard_url,
            "RAY_AUTH_TOKEN": cluster.token,
            "RAY_SERVE_URL": cluster.serve_url,
            "PORTAL_RAY_SERVE_HOST": "127.0.0.1",
            "ROLLBACK_RESUME_AFTER_S": "2",
            # Revisions the worker writes (rollout steps) are reconciled by its own task.
            "PORTAL_TEST_RECONCILE": "1" if reconcile else "",
            **(env or {}),
        }
        self.pool = (
            ["--concurrency", "2"] if reconcile else ["--concurrency", "1", "--pool", "solo"]
        )
        self.tmp = tmp
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log_path = self.tmp / f"worker-{self.starts}.log"
        self.log = log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q", self.queues,
             *self.pool, "--without-gossip", "--without-mingle", "-l", "INFO"],
            cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while "ready" not in log_path.read_text():
            assert self.process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.2)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)  # never leave a worker behind for later tests
        self.log.close()


@pytest.fixture
def worker_factory(tmp_path: Path, ray_cluster: RayCluster) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []
    celery_app.conf.task_always_eager = False

    def make(dashboard_url: str | None = None, *, reconcile: bool = False, **extra: Any) -> Worker:
        worker = Worker(
            tmp_path, ray_cluster, dashboard_url or ray_cluster.dashboard_url,
            reconcile=reconcile, **extra,
        )  # fmt: skip
        workers.append(worker)
        return worker

    try:
        yield make
    finally:
        celery_app.conf.task_always_eager = True
        for worker in workers:
            worker.stop()


class Traffic:
    """Steady client traffic through the Serve proxy, counting answers per group; with
    `pause_s`, paced rather than back to back. `versions` lists each 200's X-Model-Version
    (the weights that answered), `failures` every other answer."""

    def __init__(self, url: str, key: str, *, pause_s: float = 0.0, timeout: float = 30) -> None:
        self.url, self.key, self.pause_s, self.timeout = url, key, pause_s, timeout
        self.groups: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.last_groups: list[str] = []
        self.versions: list[str] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout, trust_env=False) as http:
            while not self.stop.is_set():
                response = http.post(
                    self.url, json={"prompt": PROMPT, "max_tokens": 1, "temperature": 0},
                    headers={"authorization": f"Bearer {self.key}"},
                )  # fmt: skip
                self.statuses[response.status_code] += 1
                group = response.headers.get("x-ab-group", "?")
                self.groups[group] += 1
                self.last_groups = [*self.last_groups[-49:], group]
                if response.status_code == 200:
                    self.versions.append(response.headers.get("x-model-version", ""))
                else:
                    self.failures.append(f"{response.status_code} {response.text[:200]}")
                if self.pause_s:
                    self.stop.wait(self.pause_s)

    def wait(self, done: Callable[[list[str]], bool], timeout: float) -> None:
        """Until `done(versions)`; a failed answer meanwhile fails at once."""
        deadline = time.monotonic() + timeout
        while not done(list(self.versions)):
            assert not self.failures, self.failures[:3]
            assert time.monotonic() < deadline, (self.versions[-10:], self.failures[:3])
            time.sleep(0.2)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def _deploy_failing_canary(world: TenantWorld, cluster: RayCluster) -> tuple[Deployment, str]:
    actor = Actor(user=world.owner)
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    Deployment.objects.exclude(pk=deployment.pk).update(deleted_at=deployment.created_at)
    _, key = deployments.inference_key_create(
        tenant=world.tenant, actor=actor, deployment=deployment, name="client"
    )
    contract_set(tenant=world.tenant, actor=actor, deployment=deployment, source=FAST_CONTRACT)
    v2 = _version(world, "v2")
    deployments.deployment_change(
        tenant=world.tenant, actor=actor, deployment=deployment,
        changes={"canary_version": v2.pk, "canary_percent": 20,
                 "faults": {"canary": {"error_rate": 0.3}}},
        reason="canary v2 at 20% (fails 30%)",
    )  # fmt: skip
    client = cluster.client()
    control.reconcile(target=cluster.target, client=client)
    app = f"{world.tenant.slug}.assistant"
    client.wait_until([app, f"{app}.canary"], timeout=180)
    wait_running(deployment, client)
    return deployment, key


def wait_running(deployment: Deployment, client: Any, timeout: float = 60) -> None:
    """The status refresh says running (on a loaded machine Serve may still be settling the
    last replica right after its applications first report RUNNING)."""
    deadline = time.monotonic() + timeout
    while True:
        control.refresh_status(client=client)
        deployment.refresh_from_db()
        if deployment.status == DeploymentStatus.RUNNING:
            return
        assert time.monotonic() < deadline, (deployment.status, deployment.status_message)
        time.sleep(1.0)


def _tick_until(done: Callable[[], bool], timeout: float) -> float:
    """Enqueue a health tick every second (as beat does) until `done`; seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        health_tick.delay()
        if done():
            return time.monotonic() - started
        time.sleep(1.0)
    raise AssertionError(f"not done within {timeout} s")


def test_a_failing_canary_is_rolled_back_by_the_worker(
    world_a: TenantWorld, ray_cluster: RayCluster, worker_factory: Callable[..., Worker]
) -> None:
    deployment, key = _deploy_failing_canary(world_a, ray_cluster)
    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    worker = worker_factory()
    worker.start()
    try:
        _tick_until(
            lambda: Rollback.objects.filter(
                deployment=deployment, status=RollbackStatus.DONE
            ).exists(),
            timeout=90,
        )
        rollback = Rollback.objects.get(deployment=deployment)
        incident = Incident.objects.get(tenant=world_a.tenant, deployment=deployment)
        assert incident.rollback_id == rollback.pk and incident.status == "mitigated"
        assert traffic.groups["canary"] > 0  # the canary did serve before
        # Traffic is back on stable: the next 50 answers all come from it.
        before = sum(traffic.groups.values())
        deadline = time.monotonic() + 30
        while sum(traffic.groups.values()) < before + 60 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert traffic.last_groups[-50:] == ["stable"] * 50, traffic.last_groups
        deployment.refresh_from_db()
        assert deployment.current_revision.canary_version_id is None
        switch = (rollback.traffic_switched_at - rollback.detected_at).total_seconds()
        assert 0 <= switch < 30, switch
    finally:
        traffic.close()


def test_worker_killed_mid_rollback_leaves_exactly_one(
    world_a: TenantWorld, ray_cluster: RayCluster, worker_factory: Callable[..., Worker]
) -> None:
    from serving.ops.rollbacks import rollback_request

    deployment, key = _deploy_failing_canary(world_a, ray_cluster)
    slow = DelayingProxy(ray_cluster.dashboard_url, delay_s=8)
    first = worker_factory(slow.url)
    first.start()
    try:
        rollback, created = rollback_request(
            tenant=world_a.tenant, deployment=deployment, trigger="manual", reason="kill test"
        )
        assert created
        assert slow.held.wait(30), "the rollback never reached the Serve API"
        rollback.refresh_from_db()
        assert rollback.status == RollbackStatus.SWITCHING and rollback.new_revision_id
        first.kill()  # SIGKILL while its PUT is held by the proxy
    finally:
        slow.close()
    revisions = deployment.revisions.count()
    second = worker_factory()
    second.start()
    _tick_until(
        lambda: Rollback.objects.get(pk=rollback.pk).status == RollbackStatus.DONE, timeout=60
    )
    assert Rollback.objects.filter(deployment=deployment).count() == 1
    assert deployment.revisions.count() == revisions  # the revision was written once
    client = ray_cluster.client()
    app = f"{world_a.tenant.slug}.assistant"
    client.wait_until([f"{app}.canary"], ["ABSENT"], timeout=60)
    with httpx.Client(timeout=30, trust_env=False) as http:
        groups = {
            http.post(
                f"{ray_cluster.serve_url}/acme/assistant/v1/completions",
                json={"prompt": PROMPT, "max_tokens": 1}, headers={"authorization": f"Bearer {key}"},
            ).headers.get("x-ab-group")
            for _ in range(20)
        }  # fmt: skip
    assert groups == {"stable"}


def test_a_good_canary_is_promoted_through_its_steps_by_the_worker(
    world_a: TenantWorld, ray_cluster: RayCluster, worker_factory: Callable[..., Worker]
) -> None:
    from serving.ops import rollouts
    from serving.ops.health import deployment_health
    from serving.ops.models import RolloutStatus

    actor = Actor(user=world_a.owner)
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    Deployment.objects.exclude(pk=deployment.pk).update(deleted_at=deployment.created_at)
    _, key = deployments.inference_key_create(
        tenant=world_a.tenant, actor=actor, deployment=deployment, name="client"
    )
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=FAST_CONTRACT)
    v2 = _version(world_a, "v2")
    rollouts.policy_set(
        tenant=world_a.tenant, actor=actor, deployment=deployment,
        values={"steps": [{"weight": 20, "pause_s": 3}, {"weight": 50, "pause_s": 3}],
                "analysis_interval_s": 2, "min_requests": 5},
    )  # fmt: skip
    rollout = rollouts.rollout_start(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk
    )
    client = ray_cluster.client()
    app = f"{world_a.tenant.slug}.assistant"
    control.reconcile(target=ray_cluster.target, client=client)
    client.wait_until([app, f"{app}.canary"], timeout=180)
    control.refresh_status(client=client)
    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    worker = worker_factory(reconcile=True)
    worker.start()
    try:
        _tick_until(
            lambda: Rollout.objects.get(pk=rollout.pk).status != RolloutStatus.PROGRESSING,
            timeout=120,
        )
        rollout.refresh_from_db()
        assert rollout.status == RolloutStatus.SUCCESSFUL, rollout.message
        results = list(rollout.analyses.order_by("at").values_list("step_index", "result"))
        assert (0, "successful") in results and (1, "successful") in results, results
        deployment.refresh_from_db()
        assert deployment.current_revision.stable_version_id == v2.pk
        assert deployment.current_revision.canary_version_id is None
        assert not Rollback.objects.filter(deployment=deployment).exists()
        # The synthetic probe went through the Serve proxy with the derived probe key.
        assert deployment_health(deployment.pk)["probe"]["ok"] is True
        assert traffic.statuses[200] > 0 and set(traffic.statuses) == {200}, traffic.statuses
        # Serve follows: the canary application goes away, v2 answers as stable.
        client.wait_until([f"{app}.canary"], ["ABSENT"], timeout=90)
        assert traffic.groups["canary"] > 0
    finally:
        traffic.close()


def test_gpu_processes_are_attributed_to_real_replica_pids(
    world_a: TenantWorld, ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML is faked (no GPU here) but the pids are those of the real Serve replicas, found
    through what the replicas themselves published: attribution works on live processes."""
    import json

    import redis
    from asgiref.sync import async_to_sync
    from django.conf import settings

    from serving.telemetry.agent import AgentConfig, GpuAgent, sample_log, tenant_group, views
    from serving.telemetry.providers.nvml import NvmlProvider
    from tests.telemetry.test_providers import FakeGpu, FakeNvml

    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    Deployment.objects.exclude(pk=deployment.pk).update(deleted_at=deployment.created_at)
    client = ray_cluster.client()
    control.reconcile(target=ray_cluster.target, client=client)
    app = f"{world_a.tenant.slug}.assistant"
    client.wait_until([app], timeout=180)
    r = redis.Redis.from_url(settings.REDIS_URL)
    deadline = time.monotonic() + 90
    published: list[dict[str, Any]] = []
    while not published and time.monotonic() < deadline:
        raw = r.hgetall(f"{settings.SLI_KEY_PREFIX}:sli:{app}:stable")
        published = [  # live replicas only: a replaced one's last value lingers a while
            snapshot for snapshot in map(json.loads, raw.values())
            if time.time() - float(snapshot.get("window", {}).get("end", 0)) < 3
            and Path(f"/proc/{snapshot['pid']}").exists()
            and (snapshot.get("kv") or {}).get("num_blocks")  # its weights are loaded
        ]  # fmt: skip
        time.sleep(0.5)
    assert published, "the replica published no SLI snapshot"
    pids = {int(p["pid"]): str(p["replica"]) for p in published}
    for pid in pids:  # live processes of this machine, Ray's replica actors
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert "ServeReplica" in cmdline or "ray" in cmdline, cmdline
    gpus = [FakeGpu(uuid="GPU-0", processes=[(pid, 2 << 30) for pid in pids] + [(1, 1 << 30)])]
    FakeNvml(gpus).install(monkeypatch)

    async def step() -> dict[str, Any]:
        import redis.asyncio as aioredis

        agent = GpuAgent(AgentConfig(node="node-a", persist=False), provider=NvmlProvider(),
                         redis_client=aioredis.Redis.from_url(settings.REDIS_URL))  # fmt: skip
        assert agent.open()
        agent.log = sample_log()
        try:
            snapshot = await agent.step()
            return {"snapshot": snapshot, "views": views(snapshot, agent.replicas, agent.owners)}
        finally:
            await agent.log.aclose()
            await agent.redis.aclose()

    result = async_to_sync(step)()
    attributed = {p["pid"]: p for p in result["snapshot"]["processes"]}
    for pid, replica in pids.items():
        assert attributed[pid]["deployment_id"] == deployment.pk
        assert attributed[pid]["tenant_id"] == world_a.tenant.pk
        assert attributed[pid]["replica"] == replica
    assert attributed[1]["tenant_id"] is None  # pid 1 is nobody's replica
    mine = result["views"][tenant_group(world_a.tenant.pk)]
    assert {p["replica"] for p in mine["processes"]} == set(pids.values())
    assert mine["kv"]["assistant"][0]["blocks_total"] > 0  # the engine's real KV pool

    # The replicas say which Ray node they run on: pids are matched on their own node.
    nodes = {p["node"] for p in published}
    assert len(nodes) == 1 and all(nodes), nodes
    (ray_node,) = nodes

    # GPU_AGENT_MODE=ray: the same reconcile declares one sampler per node (one node here,
    # no GPU: the labelled simulation), and the relay turns its stream into the tenant's.
    from channels.layers import get_channel_layer

    from serving.control.compile import GPU_NODES_APP
    from serving.telemetry.providers.nodes import node_stream, nodes_key
    from serving.telemetry.relay import Relay

    monkeypatch.setattr(settings, "GPU_AGENT_MODE", "ray")
    monkeypatch.setattr(settings, "GPU_AGENT_SIMULATE", True)
    r.delete(nodes_key(settings.SLI_KEY_PREFIX))
    control.reconcile(target=ray_cluster.target, client=client)
    client.wait_until([GPU_NODES_APP], timeout=120)
    (sampler,) = client.replicas(GPU_NODES_APP)
    assert sampler.node_id == ray_node  # on the node it samples
    deadline = time.monotonic() + 60
    reports: dict[bytes, bytes] = {}
    while not reports and time.monotonic() < deadline:
        reports = r.hgetall(nodes_key(settings.SLI_KEY_PREFIX))
        time.sleep(0.2)
    (report,) = [json.loads(v) for v in reports.values()]
    assert report["ray_node"] == ray_node and report["simulated"] is True, report
    assert control.gpu_nodes_changed(client, client.applications()) is False

    async def relay_once() -> dict[str, Any]:
        import redis.asyncio as aioredis

        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(tenant_group(world_a.tenant.pk), channel)
        relay = Relay(layer=layer, redis_client=aioredis.Redis.from_url(settings.REDIS_URL),
                      persist=False)  # fmt: skip
        try:
            assert await relay.discover() == [node_stream(settings.SLI_KEY_PREFIX,
                                                          report["node"])]  # fmt: skip
            deadline = time.monotonic() + 30
            while not await relay.step(block_ms=3000):
                assert time.monotonic() < deadline, "the node's sampler streamed nothing"
            # The first sample hosts the replicas on the simulated devices; take a later one.
            message = await layer.receive(channel)
            await relay.step(block_ms=3000)
            message = await layer.receive(channel)
            return json.loads(message["data"])
        finally:
            await layer.group_discard(tenant_group(world_a.tenant.pk), channel)
            for agent in relay.agents.values():
                await agent.log.aclose()
            await relay.redis.aclose()

    view = async_to_sync(relay_once)()
    assert view["simulated"] is True and view["node"] == report["node"]
    assert {p["replica"] for p in view["processes"]} == set(pids.values())
