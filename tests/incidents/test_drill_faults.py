"""The active drill faults without Ray (incidents.drills.faults): kv_pollution_probe,
token_starvation, weight_swap_jitter and control_plane_delay, each run step by step.

The data plane here is the real one minus Ray: each deployment's real Router (its stable slot
in-process: a VersionCore with the engine on the tiny checkpoint) behind uvicorn on a loopback
port, configured from what reconcile compiles; `DataPlane.apply()` plays Serve's part (calling
reconfigure() with each new user_config). The replicas publish their SLI windows and KV
counters to the real Redis. The Ray tests (tests/reliability/test_drill_faults_ray.py) run the
same faults through Serve with a Celery worker.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import redis
import uvicorn
from django.conf import settings
from django.contrib.auth.models import User
from starlette.requests import Request
from starlette.responses import JSONResponse

from incidents import drills
from incidents.drills import faults as drill_faults
from incidents.drills.models import ChaosDrill, DrillRun, DrillStatus
from incidents.drills.policy import PLATFORM_FAULTS
from portal.exceptions import PermissionDeniedError, ValidationFailed
from serving.control.cluster import RayTarget
from serving.control.compile import ROUTER_IMPORT
from serving.control.serve_api import ServeApiClient
from serving.dataplane.app import Router
from serving.deployments import services as deploy
from serving.deployments.chaos import control_delay_key
from serving.deployments.models import Deployment, DeploymentRevision
from serving.deployments.specs import compiled_config
from serving.ops import health
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import _ready

pytestmark = pytest.mark.django_db

NO_CONTRACT = {"contract": False, "probes": [{"sli": "error_rate", "max": 0.5}]}


class DataPlane:
    """The real routers behind uvicorn in a thread (see the module doc)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.routers: dict[str, tuple[str, Router]] = {}  # app -> (route prefix, router)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self._asgi, log_level="warning", lifespan="off", interface="asgi3")
        self.server = uvicorn.Server(config)
        self.serving: Future[None] = asyncio.run_coroutine_threadsafe(
            self.server.serve(sockets=[sock]), self.loop
        )
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    async def _asgi(self, scope: Any, receive: Any, send: Any) -> None:
        for prefix, router in list(self.routers.values()):
            if scope["path"].startswith(prefix + "/"):
                response = await router(Request({**scope, "root_path": prefix}, receive))
                await response(scope, receive, send)
                return
        await JSONResponse({"error": "no such application"}, 404)(scope, receive, send)

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def apply(self) -> None:
        """What a reconcile would PUT, applied the way Serve applies a user_config change."""
        target = RayTarget(address="127.0.0.1:1", dashboard_url="http://127.0.0.1:1",
                           serve_url=self.url, token="t")  # fmt: skip
        config, _ = compiled_config(target)
        wanted = set()
        for app in config["applications"]:
            if app["import_path"] != ROUTER_IMPORT:
                continue
            wanted.add(app["name"])
            if app["name"] not in self.routers:
                local = app["args"].get("local")
                router = self._run(self._make(local))
                self.routers[app["name"]] = (app["route_prefix"], router)
            router = self.routers[app["name"]][1]
            self._run(router.reconfigure(app["deployments"][0]["user_config"]))
        for name in set(self.routers) - wanted:
            self.remove(name)

    async def _make(self, local: dict[str, Any] | None) -> Router:
        return Router.func_or_class(local=local)  # type: ignore[no-any-return]

    def remove(self, app: str) -> None:
        _, router = self.routers.pop(app)
        self._run(self._close(router))

    async def _close(self, router: Router) -> None:
        for publisher in (router.publisher, getattr(router.local, "publisher", None)):
            if publisher is None:
                continue
            if publisher._task is not None:
                publisher._task.cancel()
            if publisher._redis is not None:
                await publisher._redis.aclose()
        if router.local is not None:
            router.local.chaos.close()
            if router.local.engine is not None:
                router.local.engine.stop()

    def close(self) -> None:
        for app in list(self.routers):
            self.remove(app)
        self.server.should_exit = True
        self.serving.result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class _Dashboard(BaseHTTPRequestHandler):
    """Answers the Serve REST API's GET with no applications: the portal's client, timed."""

    def do_GET(self) -> None:
        payload = json.dumps({"applications": {}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def plane(monkeypatch: pytest.MonkeyPatch) -> Iterator[DataPlane]:
    data_plane = DataPlane()
    dashboard = ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    threading.Thread(target=dashboard.serve_forever, daemon=True).start()
    for name, value in {
        "RAY_ADDRESS": "127.0.0.1:1", "RAY_AUTH_TOKEN": "t", "RAY_SERVE_URL": data_plane.url,
        "RAY_DASHBOARD_URL": f"http://127.0.0.1:{dashboard.server_address[1]}",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    try:
        yield data_plane
    finally:
        data_plane.close()
        dashboard.shutdown()
        dashboard.server_close()


def _actor(world: TenantWorld, fault: str) -> Actor:
    """Platform faults are run by platform staff (incidents.drills.policy)."""
    if fault not in PLATFORM_FAULTS:
        return Actor(user=world.owner)
    staff, _ = User.objects.get_or_create(
        username="sre@platform.example", defaults={"email": "sre@platform.example",
                                                   "is_staff": True},
    )  # fmt: skip
    return Actor(user=staff)


def _drill(world: TenantWorld, fault: str, **extra: Any) -> Any:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    data: dict[str, Any] = {"name": f"{fault} drill", "fault": fault, "group": "stable",
                            "duration_s": 10, "steady_state": NO_CONTRACT, **extra}  # fmt: skip
    return drills.drill_create(
        tenant=world.tenant, actor=_actor(world, fault), deployment=deployment, **data
    )


def _start(world: TenantWorld, drill: Any, plane: DataPlane | None, now: float) -> DrillRun:
    run = drills.run_start(tenant=world.tenant, actor=_actor(world, drill.fault), drill=drill)
    assert drills.run_advance(run.pk, now) == 0  # -> checking
    assert drills.run_advance(run.pk, now + 0.01) == 0  # the steady state holds -> injecting
    assert drills.run_advance(run.pk, now + 0.02) == drills.STEP_S
    run.refresh_from_db()
    assert run.status == DrillStatus.OBSERVING, run.verdict
    if plane is not None:
        plane.apply()  # the reconcile of the fault's revision
    return run


def _finish(run: DrillRun, plane: DataPlane | None, at: float) -> DrillRun:
    """Duration over -> the revert -> the steps after it, until the verdict."""
    run.refresh_from_db()
    if run.status == DrillStatus.OBSERVING:
        assert drills.run_advance(run.pk, at) == 0
    drills.run_advance(run.pk, at + 0.1)  # the revert
    if plane is not None:
        plane.apply()
    for step in range(5):  # past the wait for late rows (DETECTION_WAIT_S) of an unnoticed fault
        if drills.run_advance(run.pk, at + 1 + step * 10) is None:
            break
    run.refresh_from_db()
    return run


def _kinds(run: DrillRun) -> list[str]:
    return list(run.events.values_list("kind", flat=True))


# --- the catalogue and validation -----------------------------------------------------------


def test_the_catalogue_describes_the_four_faults() -> None:
    faults = {f["fault"]: f for f in drills.catalogue()}
    assert faults["kv_pollution_probe"]["parameters"]["replays_per_step"] == {
        "min": 1, "max": 10, "default": 2,
    }  # fmt: skip
    assert set(faults["token_starvation"]["parameters"]) == {
        "concurrency", "prompt_chars", "max_tokens", "bystander_max_error_rate",
    }  # fmt: skip
    assert faults["weight_swap_jitter"]["parameters"]["interval_s"]["default"] == 5
    assert faults["control_plane_delay"]["parameters"]["delay_ms"]["max"] == 10_000
    assert "control plane" in faults["control_plane_delay"]["blast_radius"]
    assert faults["token_starvation"]["blast_radius"].startswith("the whole slot")
    assert faults["error_burst"]["blast_radius"] == "traffic_share"  # as before


@pytest.mark.parametrize(
    ("fault", "extra", "field"),
    [
        ("kv_pollution_probe", {"group": "canary"}, "group"),
        ("kv_pollution_probe", {"parameters": {"replays_per_step": 11}},
         "parameters.replays_per_step"),
        ("kv_pollution_probe", {"parameters": {"prompt_chars": 100.5}}, "parameters.prompt_chars"),
        ("token_starvation", {"parameters": {"concurrency": 0}}, "parameters.concurrency"),
        ("token_starvation", {"parameters": {"concurrency": 2.5}}, "parameters.concurrency"),
        ("token_starvation", {"parameters": {"bystander_max_error_rate": 1.5}},
         "parameters.bystander_max_error_rate"),
        ("token_starvation", {"parameters": {"delay_ms": 5}}, "parameters.delay_ms"),
        ("weight_swap_jitter", {"parameters": {"reloads": 4, "interval_s": 5}},
         "parameters.reloads"),  # 3 intervals of 5 s do not fit in 10 s
        ("weight_swap_jitter", {"parameters": {"interval_s": 0}}, "parameters.interval_s"),
        ("control_plane_delay", {"parameters": {"delay_ms": 20_000}}, "parameters.delay_ms"),
        ("control_plane_delay", {"parameters": {"delay_ms": "slow"}}, "parameters.delay_ms"),
    ],
)  # fmt: skip
def test_bad_drills_of_the_new_faults_are_refused_naming_the_field(
    world_a: TenantWorld, fault: str, extra: dict[str, Any], field: str
) -> None:
    _ready(world_a)
    with pytest.raises(ValidationFailed) as exc:
        _drill(world_a, fault, **extra)
    assert exc.value.field == field, exc.value.message
    assert not ChaosDrill.objects.exists()


# --- kv_pollution_probe ---------------------------------------------------------------------


def test_a_kv_pollution_probe_sees_no_cross_tenant_hit_and_passes(
    world_a: TenantWorld, plane: DataPlane
) -> None:
    deployment = _ready(world_a)
    plane.apply()
    drill = _drill(world_a, "kv_pollution_probe", parameters={"replays_per_step": 2})
    now = time.time()
    run = _start(world_a, drill, plane, now)
    fault = Deployment.objects.get(pk=deployment.pk).current_revision.faults["stable"]
    probe = fault["kv_pollution_probe"]
    assert probe["identity"] == f"drill-probe:{run.pk}" and len(probe["key_hash"]) == 64
    assert drill_faults.drill_probe_key(run.pk) not in json.dumps(fault)  # only its hash
    for step in range(1, 4):
        time.sleep(1.1)  # the replicas publish their counters once a second
        assert drills.run_advance(run.pk, now + step) == drills.STEP_S
    time.sleep(1.1)
    run = _finish(run, plane, now + 11)
    assert run.status == DrillStatus.PASSED, (run.verdict, run.probes)
    measured = run.probes["fault"]
    assert measured["replays_ok"] == measured["replays_sent"] == 6
    assert measured["cross_tenant_hits"] == 0
    assert measured["replay_queries"] > 0 and measured["own_repeat_hits"] > 0
    assert measured["replicas_checked"] == 1
    # Detected by the probe itself: it could have seen a hit (no cross-tenant one came).
    assert run.detected_by == "probe" and run.revert_revision is not None
    assert "cross-tenant" not in " ".join(run.events.values_list("message", flat=True))
    assert Deployment.objects.get(pk=deployment.pk).current_revision.faults == {}
    # The revert took the identity out of the replica: its key is refused again.
    answer = httpx.post(
        f"{plane.url}/acme/assistant/v1/completions", json={"prompt": "hi", "max_tokens": 1},
        headers={"authorization": f"Bearer {drill_faults.drill_probe_key(run.pk)}"},
    )  # fmt: skip
    assert answer.status_code == 401


def _publish_counters(deployment: Deployment, tenants: dict[str, Any]) -> None:
    """A replica's snapshot as a broken engine would publish it (hits for another tenant)."""
    snapshot = {"app": f"acme.{deployment.name}", "group": "stable", "replica": "broken",
                "window": {"end": time.time()}, "kv": {"tenants": tenants}}  # fmt: skip
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.hset(f"{settings.SLI_KEY_PREFIX}:sli:acme.assistant:stable", "broken",
                json.dumps(snapshot))  # fmt: skip


def test_a_cross_tenant_hit_fails_the_run_at_once(world_a: TenantWorld, plane: DataPlane) -> None:
    deployment = _ready(world_a)
    plane.apply()
    drill = _drill(world_a, "kv_pollution_probe", duration_s=60)
    now = time.time()
    run = _start(world_a, drill, plane, now)
    identity = f"drill-probe:{run.pk}"
    _publish_counters(deployment, {identity: {"prefix_hits": 32, "prefix_queries": 64},
                                   str(world_a.tenant.pk): {"prefix_hits": 48}})  # fmt: skip
    assert drills.run_advance(run.pk, now + 1) == 0  # straight to reverting
    run.refresh_from_db()
    assert run.status == DrillStatus.REVERTING and run.deviated
    assert run.detected_at is not None and run.mttd_s is not None and run.mttd_s < 2
    run = _finish(run, plane, now + 2)
    assert run.status == DrillStatus.FAILED
    assert run.verdict.startswith("KV cache isolation broken"), run.verdict
    assert f"found 32 prompt tokens of tenant {world_a.tenant.pk}" in run.verdict
    assert "detected" in _kinds(run)


def test_replays_that_never_run_as_another_tenant_are_inconclusive(
    world_a: TenantWorld, plane: DataPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A router that took the probe key as the tenant's own (a broken probe) must not pass:
    no replay reached the cache under the probe identity."""
    from serving.dataplane.faults import FaultInjector

    _ready(world_a)
    plane.apply()
    tenant = str(world_a.tenant.pk)
    monkeypatch.setattr(FaultInjector, "probe_identity",
                        lambda self, key_hash: tenant if self.active().kv_pollution_probe
                        else None)  # fmt: skip
    run = _start(world_a, _drill(world_a, "kv_pollution_probe"), plane, now := time.time())
    time.sleep(1.1)
    drills.run_advance(run.pk, now + 1)
    time.sleep(1.1)
    run = _finish(run, plane, now + 11)
    assert run.status == DrillStatus.FAILED and run.verdict.startswith("inconclusive")
    assert run.probes["fault"]["replays_ok"] > 0 and run.probes["fault"]["replay_queries"] == 0


def test_a_shared_deployment_cannot_take_the_probe(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    drill = _drill(world_a, "kv_pollution_probe")
    # As if it ran on a shared pool (no pool needed: the run stops before anything is applied).
    DeploymentRevision.objects.filter(pk=deployment.current_revision_id).update(kv_mode="shared")
    # A tenant cannot drill a pool at all (incidents.drills.policy); staff get the precheck's no.
    with pytest.raises(PermissionDeniedError):
        drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    run = drills.run_start(tenant=world_a.tenant, actor=_actor(world_a, "control_plane_delay"),
                           drill=drill)  # fmt: skip
    now = time.time()
    for step in range(3):
        drills.run_advance(run.pk, now + step / 10)
    run.refresh_from_db()
    assert run.status == DrillStatus.ABORTED and "dedicated deployment" in run.verdict
    assert run.fault_revision is None


# --- token_starvation -----------------------------------------------------------------------


def test_a_flood_is_refused_by_the_quota_and_the_neighbour_keeps_serving(
    world_a: TenantWorld, world_b: TenantWorld, plane: DataPlane
) -> None:
    deployment = _ready(world_a)
    _ready(world_b)
    # 16 blocks of 16 tokens: prompts over ~450 characters (~250 tokens of the tiny model's
    # tokenizer) can never fit, so admission refuses them; the shorter ones are served.
    deploy.deployment_change(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                             deployment=deployment, changes={"kv_blocks": 16}, reason="small")  # fmt: skip
    plane.apply()
    drill = _drill(world_a, "token_starvation", parameters={
        "concurrency": 3, "prompt_chars": 1000, "max_tokens": 8})  # fmt: skip
    now = time.time()
    run = _start(world_a, drill, plane, now)
    assert run.fault_revision is None  # traffic, not a change to Serve
    assert AuditEvent.objects.filter(tenant=world_a.tenant, action="drill.fault_injected").exists()
    assert drills.run_advance(run.pk, now + 1) == drills.STEP_S  # one flood burst (3 s)
    run = _finish(run, plane, now + 11)
    assert run.status == DrillStatus.PASSED, (run.verdict, run.detection)
    assert run.detected_by == "probe" and run.effect_at is not None
    flood, watch = run.probes["fault"]["flood"], run.probes["fault"]["bystanders"]
    assert flood["sent"] > 3 and flood["refused_quota"] > 0, flood
    assert flood["ok"] + flood["refused_quota"] == flood["sent"], flood
    assert set(flood["statuses"]) <= {"200", "429"}, flood
    assert run.probes["fault"]["bystander_count"] == 1
    assert watch["probes"] >= 3 and watch["failed"] == 0, watch
    assert "reverted" in _kinds(run)


def test_a_neighbour_failing_during_the_flood_fails_the_run(
    world_a: TenantWorld, world_b: TenantWorld, plane: DataPlane
) -> None:
    _ready(world_a)
    _ready(world_b)
    plane.apply()
    plane.remove("globex.assistant")  # the neighbour answers 404 to every probe
    drill = _drill(world_a, "token_starvation", parameters={
        "concurrency": 2, "prompt_chars": 200, "max_tokens": 4})  # fmt: skip
    now = time.time()
    run = _start(world_a, drill, None, now)
    drills.run_advance(run.pk, now + 1)
    run = _finish(run, None, now + 11)
    assert run.status == DrillStatus.FAILED
    assert run.verdict.startswith("quotas did not protect other tenants"), run.verdict
    assert run.probes["fault"]["flood"]["ok"] > 0  # this flood fit and was served


def test_flood_prompts_beyond_the_models_context_are_cut_to_fit(
    world_a: TenantWorld, plane: DataPlane
) -> None:
    """The catalogue's default (2000 characters) is beyond the tiny model's 1024 positions:
    every flood request would be a 400 and the run inconclusive (bench/drills.py)."""
    deployment = _ready(world_a)
    assert deployment.current_revision.stable_version.config_summary[
        "max_position_embeddings"] == 1024  # fmt: skip
    plane.apply()
    drill = _drill(world_a, "token_starvation", parameters={
        "concurrency": 2, "prompt_chars": 5000, "max_tokens": 8})  # fmt: skip
    now = time.time()
    run = _start(world_a, drill, None, now)
    assert run.probes["fault"]["prompt_chars"] == 1024 - 8 - 16
    assert "prompt_clamped" in _kinds(run)
    drills.run_advance(run.pk, now + 1)
    run = _finish(run, None, now + 11)
    flood = run.probes["fault"]["flood"]
    assert flood["sent"] > 0 and "400" not in flood["statuses"], flood


# --- weight_swap_jitter ---------------------------------------------------------------------


class _Traffic:
    """Client requests through the data plane while the weights are swapped."""

    def __init__(self, url: str, key: str) -> None:
        self.statuses: Counter[int] = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(url, key), daemon=True)
        self.thread.start()

    def _run(self, url: str, key: str) -> None:
        with httpx.Client(timeout=30, trust_env=False) as http:
            while not self.stop.is_set():
                answer = http.post(url, json={"prompt": "hello", "max_tokens": 2},
                                   headers={"authorization": f"Bearer {key}"})  # fmt: skip
                self.statuses[answer.status_code] += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def _key(world: TenantWorld, deployment: Deployment) -> str:
    _, key = deploy.inference_key_create(tenant=world.tenant, actor=Actor(user=world.owner),
                                         deployment=deployment, name="client")  # fmt: skip
    return key


def test_hot_reloads_under_traffic_fail_no_request(world_a: TenantWorld, plane: DataPlane) -> None:
    deployment = _ready(world_a)
    key = _key(world_a, deployment)
    plane.apply()
    traffic = _Traffic(f"{plane.url}/acme/assistant/v1/completions", key)
    drill = _drill(world_a, "weight_swap_jitter", parameters={"reloads": 3, "interval_s": 2})
    now = time.time()
    try:
        health.tick(now=now - 1, act=False)
        run = _start(world_a, drill, plane, now)  # reload 1 (the injection)
        assert drills.run_advance(run.pk, now + 1) == drills.STEP_S  # not due yet
        assert drills.run_advance(run.pk, now + 2.1) == drills.STEP_S  # reload 2
        assert drills.run_advance(run.pk, now + 2.2) == drills.STEP_S  # the same step again
        plane.apply()
        assert drills.run_advance(run.pk, now + 4.2) == drills.STEP_S  # reload 3
        plane.apply()
        assert drills.run_advance(run.pk, now + 6.3) == drills.STEP_S  # all 3 written
        time.sleep(1.2)  # the replica publishes the reload it did
        health.tick(now=time.time(), act=False)
        run = _finish(run, plane, max(time.time(), now + 11))
    finally:
        traffic.close()
    assert run.status == DrillStatus.PASSED, (run.verdict, run.probes)
    measured = run.probes["fault"]
    assert measured["reloads_written"] == 3 and measured["errors"] == 0
    assert measured["requests"] > 0
    assert [a["nonce"] for a in measured["applied"].values()] == [3]
    reasons = list(DeploymentRevision.objects.filter(
        deployment=deployment, reason__contains=f"(run {run.pk})").values_list("reason", flat=True))  # fmt: skip
    assert len(reasons) == 4, reasons  # inject (reload 1), reloads 2 and 3, revert
    router = plane.routers["acme.assistant"][1]
    forced = [r for r in router.local.reloads if r.get("drill") == str(run.pk)]
    assert [(r["nonce"], r["ok"]) for r in forced] == [(1, True), (2, True), (3, True)]
    assert traffic.statuses and set(traffic.statuses) == {200}, traffic.statuses


def test_a_reload_that_fails_on_a_replica_fails_the_run(
    world_a: TenantWorld, plane: DataPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    from serving.dataplane.app import VersionCore

    _ready(world_a)
    plane.apply()  # loads the weights once, for real

    def broken(self: Any, config: dict[str, Any]) -> Any:
        raise OSError("checkpoint unreadable")

    monkeypatch.setattr(VersionCore, "_build_model", broken)
    drill = _drill(world_a, "weight_swap_jitter", parameters={"reloads": 1})
    run = _start(world_a, drill, plane, now := time.time())
    time.sleep(1.2)
    drills.run_advance(run.pk, now + 1)
    run = _finish(run, plane, now + 11)
    assert run.status == DrillStatus.FAILED
    assert run.verdict.startswith("hot reload failed on replicas"), run.verdict


# --- control_plane_delay --------------------------------------------------------------------


def test_a_control_plane_delay_slows_the_serve_api_until_the_revert(
    world_a: TenantWorld, plane: DataPlane
) -> None:
    _ready(world_a)
    drill = _drill(world_a, "control_plane_delay", parameters={"delay_ms": 400})
    now = time.time()
    run = _start(world_a, drill, None, now)
    assert run.fault_revision is None
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = control_delay_key()
    assert json.loads(client.get(key) or b"{}") == {"delay_ms": 400, "run": run.pk}
    assert 60 < client.ttl(key) <= 10 + drills.TTL_GRACE_S  # it ends by itself
    assert drill_faults.of("control_plane_delay").inject(run, now) is None  # resumable
    drills.run_advance(run.pk, now + 1)  # one timed Serve API call
    run = _finish(run, None, now + 11)
    assert run.status == DrillStatus.PASSED, (run.verdict, run.probes)
    calls = run.probes["fault"]["api_calls"]
    # One call at the first step, one at the last (5 s apart at least), one after the revert.
    assert [c["when"] for c in calls] == ["delayed", "delayed", "after the revert"]
    assert calls[0]["ms"] >= 400 and calls[1]["ms"] >= 400 and calls[2]["ms"] < 300, calls
    assert client.get(key) is None
    assert "serve_api_call" in _kinds(run) and "reverted" in _kinds(run)


def test_the_serve_api_client_waits_while_the_key_lives(plane: DataPlane) -> None:
    from serving.control.cluster import ray_target_from_env

    api = ray_target_from_env().serve_client()
    client = redis.Redis.from_url(settings.REDIS_URL)

    def timed() -> float:
        started = time.perf_counter()
        api.applications()
        return time.perf_counter() - started

    assert timed() < 0.2
    client.set(control_delay_key(), json.dumps({"run": 1, "delay_ms": 300}), px=700)
    assert timed() >= 0.3
    time.sleep(0.8)  # the TTL ran out: no delay any more, nobody had to remove it
    assert timed() < 0.2
    client.set(control_delay_key(), "not json")
    assert timed() < 0.2  # a bad value never breaks the control plane
    assert isinstance(api, ServeApiClient)


def test_a_second_delay_while_one_is_in_force_is_aborted(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    _ready(world_a)
    _ready(world_b)
    first = _start(world_a, _drill(world_a, "control_plane_delay"), None, now := time.time())
    second = drills.run_start(tenant=world_b.tenant, actor=_actor(world_b, "control_plane_delay"),
                              drill=_drill(world_b, "control_plane_delay"))  # fmt: skip
    for step in range(3):
        drills.run_advance(second.pk, now + step / 10)
    second.refresh_from_db()
    assert second.status == DrillStatus.ABORTED
    assert "another control_plane_delay is in force" in second.verdict
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert json.loads(client.get(control_delay_key()) or b"{}")["run"] == first.pk
