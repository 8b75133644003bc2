"""The hostile-tenant suite: one tenant (Acme) attacks through the public API and the data
plane while its neighbour (Globex) serves steady traffic on the same local Ray cluster.

The attacks: colliding names, floods within and beyond its own capacity, long prompts, every
drill a tenant may start (and the ones it may not), webhook targets of every refused kind,
oversized and expanding uploads, chat templates that try to escape Jinja's sandbox or loop (the
version fails validation), a shared pool it was never granted, vLLM knobs beyond its share (KV
memory, a GPU's memory, tensor parallel GPUs) and a cache salt of its own, a deployment bigger
than the cluster, a request id that would forge log lines, another tenant's weights
through the artifact route, many tenants per user, a hammered control API. Asserted: the neighbour sees 0 failed requests, its deployment changes
still apply, its p99 latency rises by at most NEIGHBOUR_P99_FACTOR (the measured factor is printed), and every hostile action got a clear
4xx whose body names the field."""

from __future__ import annotations

import asyncio
import io
import json
import statistics
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from django.core.cache import cache
from rest_framework.test import APIClient

from incidents.drills.models import DrillStatus
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.capacity import CACHE_KEY
from serving.deployments.models import Deployment, DeploymentStatus, SharedPool
from serving.engine.testing import write_tiny_checkpoint
from serving.registry import delivery
from tenants.actors import Actor
from tenants.auth import token_cache
from tenants.models import Quota
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.reliability.test_drill_faults_ray import _ended, _explain, _run
from tests.reliability.test_drills_ray import CHAOS_QUEUES
from tests.serving.test_ops_ray import Traffic, Worker, wait_running, worker_factory  # noqa: F401
from tests.serving.test_serving_ray import _apply, _key, _ready_version, _served

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

# On two shared cores the flood's CPU is the neighbour's CPU: a bounded slowdown, no failure.
# Measured here: 2.5-9.6x (p99 14-44 ms before, 78-167 ms under attack); the bound leaves CI
# room (a low baseline makes the ratio jumpy).
NEIGHBOUR_P99_FACTOR = 20.0
PROMPT = "The quick brown fox jumps over the lazy dog."


@dataclass
class Steady:
    """The neighbour's client: one request in flight at a time, every answer recorded."""

    url: str
    key: str
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    mark: int = 0

    def run(self) -> None:
        with httpx.Client(timeout=60, trust_env=False) as http:
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    answer = http.post(
                        self.url,
                        json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0},
                        headers={"authorization": f"Bearer {self.key}"},
                    )
                    if answer.status_code != 200:
                        self.failures.append(f"{answer.status_code}: {answer.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                self.latencies.append(time.perf_counter() - started)
                time.sleep(0.02)

    def p99(self, since: int = 0, until: int | None = None) -> float:
        window = sorted(self.latencies[since:until])
        return window[min(len(window) - 1, int(0.99 * len(window)))]


@pytest.fixture
def neighbour(world_b: TenantWorld, ray_cluster: RayCluster) -> Iterator[Steady]:
    url = f"{ray_cluster.serve_url}/globex/assistant/v1/completions"
    steady = Steady(url=url, key=_key(world_b, _served(world_b)))
    yield steady
    steady.stop.set()


class PatientClient(APIClient):
    """The hostile tenant's API client honours the tenant's own rate limit (a 429 with
    Retry-After is waited out and retried), so that each attack below meets the guard it aims
    at, not the limiter; the limiter itself is attacked on its own."""

    def request(self, **kwargs: Any) -> Any:
        for _ in range(20):
            response = super().request(**kwargs)
            if response.status_code != 429 or response.json()["error"]["code"] != "rate_limited":
                return response
            time.sleep(float(response.headers.get("Retry-After", 1)))
        return response


def _patient(world: TenantWorld) -> PatientClient:
    client = PatientClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_token}")
    return client


@dataclass
class Refusals:
    """Every hostile action's answer: (what, status, fields named)."""

    rows: list[tuple[str, int | str, str]] = field(default_factory=list)  # str: not an HTTP status

    def expect(self, what: str, response: Any, status: int | tuple[int, ...], name: str) -> None:
        statuses = (status,) if isinstance(status, int) else status
        body = response.json() if response.content else {}
        error = body.get("error", {})
        named = ",".join(sorted(error.get("fields") or {}))
        self.rows.append((what, response.status_code, named or error.get("message", "")[:60]))
        assert response.status_code in statuses, (what, response.status_code, body)
        assert name in (error.get("fields") or {}) or name in error.get("message", ""), (
            what,
            body,
        )


def _tar_expanding_to(size: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("config.json")
        info.size = size
        archive.addfile(info, io.BytesIO(b"\0" * size))
    return buffer.getvalue()


async def _flood(url: str, key: str, concurrency: int, seconds: float) -> dict[int, int]:
    """The hostile tenant floods its own route: `concurrency` long prompts in flight."""
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    long_prompt = ("tokens " * 80).strip()  # within the context, heavy on the KV cache

    async def one(client: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            try:
                answer = await client.post(
                    url,
                    json={"prompt": long_prompt, "max_tokens": 16, "temperature": 0},
                    headers={"authorization": f"Bearer {key}"},
                )
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            except httpx.HTTPError:
                statuses[0] = statuses.get(0, 0) + 1

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, trust_env=False, limits=limits) as client:
        await asyncio.gather(*(one(client) for _ in range(concurrency)))
    return statuses


def test_a_hostile_tenant_cannot_break_slow_starve_or_reach_its_neighbour(
    world_a: TenantWorld,
    world_b: TenantWorld,
    ray_cluster: RayCluster,
    neighbour: Steady,
    tmp_path: Path,
    settings: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = []  # the platform's default: public addresses only
    settings.ARTIFACT_STORE_DIR = tmp_path / "store"
    api = _patient(world_a)
    refused = Refusals()
    hostile_owner = Actor(user=world_a.owner)

    # --- colliding names: `assistant--canary` beside `assistant` with a canary -------------
    assistant = _served(world_a)
    v2 = _ready_version(world_a, write_tiny_checkpoint(tmp_path / "v2", seed=5), "v2")
    deployments.deployment_set_canary(
        tenant=world_a.tenant, actor=hostile_owner, deployment=assistant, version_id=v2.pk,
        percent=10,
    )  # fmt: skip
    Quota.objects.filter(tenant=world_a.tenant).update(max_deployments=3)
    created = api.post(
        "/api/v1/deployments/",
        # A 16-block KV cache: the flood's prompts can never fit there (beyond its quota).
        {"name": "assistant--canary", "version": v2.pk, "num_cpus": 0.25, "kv_blocks": 16},
        format="json",
    )
    assert created.status_code == 201, created.content
    hostile_key = _key(world_a, assistant)
    small_key = _key(world_a, Deployment.objects.get(pk=created.json()["id"]))
    _apply(ray_cluster, ["acme.assistant", "acme.assistant.canary", "acme.assistant--canary",
                         "globex.assistant"], timeout=240)  # fmt: skip
    for deployment in Deployment.objects.filter(deleted_at__isnull=True):
        assert deployment.status == DeploymentStatus.RUNNING, deployment.status_message

    # --- the neighbour's baseline ------------------------------------------------------------
    thread = threading.Thread(target=neighbour.run, daemon=True)
    thread.start()
    time.sleep(8)
    baseline_end = len(neighbour.latencies)
    assert baseline_end >= 20, "the neighbour's steady traffic did not start"

    # --- floods within and beyond the hostile tenant's own capacity ------------------------
    hostile_url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    small_url = f"{ray_cluster.serve_url}/acme/assistant--canary/v1/completions"

    async def floods() -> tuple[dict[int, int], dict[int, int]]:
        return await asyncio.gather(
            _flood(hostile_url, hostile_key, concurrency=32, seconds=8),
            _flood(small_url, small_key, concurrency=4, seconds=8),
        )

    flood, beyond = asyncio.run(floods())
    assert flood.get(200, 0) > 0, flood  # its own replicas served what they could take
    assert beyond.get(429, 0) > 0 and set(beyond) == {429}, beyond  # kv_quota_exceeded
    for answers in (flood, beyond):
        assert not [s for s in answers if s == 0 or s >= 500], answers  # clear 4xx only
    # A prompt far beyond the model's context and an absurd max_tokens: the guard's 400s.
    with httpx.Client(timeout=60, trust_env=False) as http:
        auth = {"authorization": f"Bearer {hostile_key}"}
        long = http.post(hostile_url, headers=auth,
                         json={"prompt": "x " * 200_000, "max_tokens": 1})  # fmt: skip
        assert long.status_code in (400, 413), long.text
        too_many = http.post(hostile_url, headers=auth,
                             json={"prompt": PROMPT, "max_tokens": 10**9})  # fmt: skip
        assert too_many.status_code == 400 and "max_tokens" in too_many.text

    # --- drills: the platform's are refused, the tenant's bounded ---------------------------
    drill = {"group": "stable", "duration_s": 10,
             "steady_state": {"contract": False, "probes": [{"sli": "error_rate", "max": 0.5}]},
             "deployment": assistant.pk}  # fmt: skip
    for name, fault, extra, status, named in [
        ("control_plane_delay", "control_plane_delay", {}, 403, "fault"),
        ("huge leak", "gpu_memory_leak", {"parameters": {"max_mb": 1_000_000}}, 400,
         "parameters.max_mb"),
        ("flood beyond capacity", "token_starvation", {"parameters": {"concurrency": 64}}, 400,
         "parameters.concurrency"),
    ]:  # fmt: skip
        response = api.post("/api/v1/drills/", {**drill, "name": name, "fault": fault, **extra},
                            format="json")  # fmt: skip
        refused.expect(f"drill {name}", response, status, named)
    Quota.objects.filter(tenant=world_a.tenant).update(max_drills=2)
    allowed = [("errors", "error_burst", {"traffic_share": 0.2}),
               ("slow", "latency_spike", {"traffic_share": 0.2})]  # fmt: skip
    made = []
    for name, fault, extra in allowed:
        response = api.post("/api/v1/drills/", {**drill, "name": name, "fault": fault, **extra},
                            format="json")  # fmt: skip
        assert response.status_code == 201, response.content
        made.append(response.json()["id"])
    started = api.post(f"/api/v1/drills/{made[0]}/runs/")
    assert started.status_code in (201, 202), started.content
    refused.expect("a second concurrent drill run", api.post(f"/api/v1/drills/{made[1]}/runs/"),
                   409, "deployment")  # fmt: skip
    response = api.post("/api/v1/drills/", {**drill, "name": "third", "fault": "replica_hang"},
                        format="json")  # fmt: skip
    refused.expect("drill beyond max_drills", response, 403, "name")

    # --- webhook targets of every refused kind ------------------------------------------------
    dashboard = ray_cluster.dashboard_url
    for target in [
        "http://127.0.0.1:8000/hook",
        "http://localhost/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://2130706433/",
        "http://0x7f000001/",
        f"{dashboard}/api/serve/applications/",
        "http://127.0.0.1:6379/",
        "ftp://example.net/",
        "http://u:p@example.net/",
    ]:
        response = api.post("/api/v1/notification-channels/",
                            {"kind": "webhook", "name": target[:60], "url": target},
                            format="json")  # fmt: skip
        refused.expect(f"webhook {target}", response, 400, "url")

    # --- oversized and expanding uploads ------------------------------------------------------
    upload = f"/api/v1/models/{world_a.model.pk}/versions/upload/?label=bomb"
    Quota.objects.filter(tenant=world_a.tenant).update(max_storage_bytes=1024**2)
    response = api.generic("POST", upload, _tar_expanding_to(2 * 1024**2),
                           content_type="application/gzip")  # fmt: skip
    refused.expect("upload expanding beyond the storage quota", response, 403, "artifact")
    settings.ARTIFACT_UPLOAD_MAX_BYTES = 64 * 1024
    response = api.generic("POST", upload.replace("bomb", "big"), b"\0" * (65 * 1024),
                           content_type="application/x-tar")  # fmt: skip
    refused.expect("upload beyond the upload cap", response, 413, "artifact")

    # --- version checks: the neighbour's version, a load test beyond the bounds -----------------
    theirs = _served(world_b).current_revision.stable_version
    mine = assistant.current_revision.stable_version
    for model_pk in (theirs.model_id, mine.model_id):
        url = f"/api/v1/models/{model_pk}/versions/{theirs.pk}/verify/"
        response = api.post(url, {"deployment_id": assistant.pk}, format="json")
        assert response.status_code == 404, response.content
    refused.rows.append(("verifying the neighbour's version", 404, "not found"))
    checks = f"/api/v1/models/{mine.model_id}/versions/{mine.pk}"
    too_much = [
        ("a load test beyond the concurrency bound", "verify", {"concurrency": 512}, "concurrency"),
        ("a benchmark beyond the request bound", "benchmark", {"requests": 10**6}, "requests"),
        ("a load test beyond the duration bound", "verify", {"duration_s": 86400}, "duration_s"),
        (
            "a drift sample beyond its bound",
            "verify",
            {"drift_sample": {"feature": "f", "values": [0] * 5001}},
            "drift_sample.values",
        ),
    ]
    for what, path, body, named in too_much:
        body = {"deployment_id": assistant.pk, **body} if path == "verify" else body
        response = api.post(f"{checks}/{path}/", body, format="json")
        refused.expect(what, response, 400, named)
    response = api.put(f"{checks}/golden/", {"prompts": ["p"] * 50}, format="json")
    refused.expect("more golden prompts than the bound", response, 400, "prompts")
    response = api.put(f"{checks}/golden/", {"prompts": ["p" * 5000]}, format="json")
    refused.expect("a golden prompt beyond its length", response, 400, "prompts[0]")
    url = f"/api/v1/models/{theirs.model_id}/versions/{theirs.pk}/golden/"
    assert api.put(url, {"prompts": ["mine now"]}, format="json").status_code == 404

    # --- a chat template that tries to leave Jinja's sandbox, or to loop for ever -----------------
    for label, template in [
        ("escape", "{{ ''.__class__.__mro__[1].__subclasses__() }}"),
        ("loop", "{% for i in range(10**9) %}{% for j in range(10**9) %}{% endfor %}{% endfor %}"),
    ]:
        directory = write_tiny_checkpoint(tmp_path / f"jinja-{label}", seed=3)
        (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
        version = _ready_version(world_a, directory, f"jinja-{label}")
        assert version.status == "failed" and "chat template" in version.failure_reason, (
            version.status, version.failure_reason,
        )  # fmt: skip
        refused.rows.append((f"a chat template that tries to {label}", "failed", "chat_template"))

    # --- a shared pool the platform never granted it ---------------------------------------------
    SharedPool.objects.create(name="neighbours", model_version=_served(world_b).current_revision
                              .stable_version).allowed_tenants.add(world_b.tenant)  # fmt: skip
    response = api.post("/api/v1/deployments/", {"name": "squatter", "version": v2.pk,
                        "kv_mode": "shared", "pool": "neighbours"}, format="json")  # fmt: skip
    refused.expect("joining a pool it is not allowed on", response, 400, "pool")

    # --- vLLM: knobs that would take a neighbour's memory or GPUs, a cache salt of its own -------
    for what, extra, named in [
        ("vLLM on a version validated for the built-in engine only", {"engine": "vllm"},
         "engine"),
        ("a KV cache beyond the platform's bound", {"engine": {"name": "vllm",
         "cpu_kv_space_gib": 512}}, "engine.cpu_kv_space_gib"),
        ("half a GPU asking for 90% of its memory", {"num_gpus": 0.5, "engine": {"name": "vllm",
         "gpu_memory_utilization": 0.9}}, "engine.gpu_memory_utilization"),
        ("tensor parallel over GPUs it did not ask for", {"engine": {"name": "vllm",
         "tensor_parallel_size": 8}}, "engine.tensor_parallel_size"),
    ]:  # fmt: skip
        response = api.post("/api/v1/deployments/", {"name": "vllm-hog", "version": v2.pk,
                            **extra}, format="json")  # fmt: skip
        refused.expect(what, response, 400, named)
    response = api.generic("POST", upload.replace("bomb", "engines") + "&engines=vllm,evil",
                           b"", content_type="application/x-tar")  # fmt: skip
    refused.expect("registering for an engine that does not exist", response, 400, "engines")
    with httpx.Client(timeout=60, trust_env=False) as http:
        salted = http.post(hostile_url, headers={"authorization": f"Bearer {hostile_key}"},
                           json={"prompt": PROMPT, "max_tokens": 1, "cache_salt": "globex"})  # fmt: skip
    refused.expect("a request choosing its own cache salt", salted, 400, "cache_salt")
    # A request id that would forge log lines (LOG_FORMAT=json carries it on every line):
    # replaced by one of the portal's, never echoed.
    forged = 'x"\n{"level": "CRITICAL", "message": "globex is down"}'
    answered = api.get("/api/v1/deployments/", HTTP_X_REQUEST_ID=forged)
    assert answered.status_code == 200 and answered["X-Request-ID"] != forged
    assert answered["X-Request-ID"].isalnum()
    refused.rows.append(("a request id that forges log lines", "replaced", "X-Request-ID"))
    # Another tenant's weights through the route replicas fetch artifacts from: only a URL the
    # portal signed opens it, and a signature names one version.
    settings.PORTAL_INTERNAL_URL = "http://portal.internal"
    theirs = _served(world_b).current_revision.stable_version
    path = delivery.url_path(theirs.pk, theirs.sha256)
    refused.expect("another tenant's weights, unsigned", api.get(path), 403, "signature")
    mine = delivery.signed_url(v2).split("?")[1]
    refused.expect(
        "another tenant's weights, with its own version's signature",
        api.get(f"{path}?{mine}"),
        403,
        "signature",
    )

    # --- the whole cluster, or more: refused at admission, not left pending for ever -------------
    for name, value in ray_cluster.portal_env().items():
        monkeypatch.setenv(name, value)
    settings.CLUSTER_CAPACITY = True
    cache.delete(CACHE_KEY)
    Quota.objects.filter(tenant=world_a.tenant).update(max_replicas=500, max_kv_blocks=10**6)
    response = api.post("/api/v1/deployments/", {"name": "hog", "version": v2.pk,
                        "num_cpus": 64}, format="json")  # fmt: skip
    refused.expect("a deployment no node can place", response, 409, "num_cpus")
    response = api.patch(f"/api/v1/deployments/{assistant.pk}/", {"num_replicas": 40},
                         format="json")  # fmt: skip
    refused.expect("scaling beyond the cluster", response, 409, "num_replicas")
    settings.CLUSTER_CAPACITY = False

    # --- many tenants per user ------------------------------------------------------------------
    session = APIClient()
    session.force_login(world_a.owner)
    statuses = []
    for n in range(django_settings.MAX_TENANTS_PER_USER + 1):
        response = session.post("/api/v1/tenants/", {"name": f"Acme shell {n}"}, format="json")
        statuses.append(response.status_code)
    refused.expect("one tenant too many", response, 400, "name")
    assert statuses.count(201) == django_settings.MAX_TENANTS_PER_USER - 1  # it owns Acme

    # --- the control API, hammered: the hostile tenant's bucket empties, not the neighbour's ---
    Quota.objects.filter(tenant=world_a.tenant).update(requests_per_second=1)
    cache.delete(f"quota-rps:{world_a.tenant.pk}")
    # A cached token keeps the rate it was read with for API_TOKEN_CACHE_SECONDS (10 s): the
    # hammer starts once every cache has let it go (it was cached by the steps above when they
    # ran in under 10 s).
    token_cache.clear()
    hammer = world_a.client()
    answers = [hammer.get("/api/v1/deployments/") for _ in range(30)]
    limited = [a for a in answers if a.status_code == 429]
    assert limited and all(a.headers.get("Retry-After") for a in limited), [
        a.status_code for a in answers
    ]
    assert {a.status_code for a in answers} <= {200, 429}
    assert world_b.client().get("/api/v1/deployments/").status_code == 200
    refused.rows.append(
        ("the control API hammered (30 GETs at 1 rps)", 429, f"{len(limited)} limited")
    )

    # --- the neighbour's changes still apply ---------------------------------------------------
    world_b_key = _key(world_b, _served(world_b))  # a new key: a new revision to reconcile
    run = control.reconcile(target=ray_cluster.target)
    assert run.ok and "globex" not in (run.error or ""), run.error
    with httpx.Client(timeout=60, trust_env=False) as http:
        for _ in range(100):
            answer = http.post(neighbour.url, headers={"authorization": f"Bearer {world_b_key}"},
                               json={"prompt": PROMPT, "max_tokens": 1})  # fmt: skip
            if answer.status_code == 200:
                break
            time.sleep(0.2)
        assert answer.status_code == 200, answer.text

    attack_end = len(neighbour.latencies)
    neighbour.stop.set()
    thread.join(timeout=60)
    assert neighbour.failures == [], neighbour.failures[:5]
    base_p99 = neighbour.p99(0, baseline_end)
    attack_p99 = neighbour.p99(baseline_end, attack_end)
    factor = attack_p99 / base_p99
    with capsys.disabled():
        print(f"\nhostile-tenant suite: neighbour {attack_end} requests, 0 failed; p99 "
              f"{base_p99 * 1000:.1f} ms before, {attack_p99 * 1000:.1f} ms under attack "
              f"({factor:.2f}x, limit {NEIGHBOUR_P99_FACTOR:g}x); median "
              f"{statistics.median(neighbour.latencies) * 1000:.1f} ms; hostile floods "
              f"answered {dict(sorted(flood.items()))} within and {dict(sorted(beyond.items()))} "
              "beyond its quota")  # fmt: skip
        for what, status, named in refused.rows:
            print(f"  {status} {named:<28} {what}")
    assert factor <= NEIGHBOUR_P99_FACTOR


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_drills_a_tenant_may_run_stay_on_its_own_replicas(
    world_a: TenantWorld,
    world_b: TenantWorld,
    ray_cluster: RayCluster,
    neighbour: Steady,
    worker_factory: Callable[..., Worker],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The hostile tenant runs the drills it may start for real (a Celery worker steps them)
    on its own deployment: an error burst, a memory leak at its cap, crashing replicas. The
    neighbour on the same cluster answers every request."""
    client = ray_cluster.client()
    control.reconcile(target=ray_cluster.target, client=client)
    client.wait_until(["acme.assistant", "globex.assistant"], timeout=180)
    hostile = _served(world_a)
    for deployment in (hostile, _served(world_b)):
        wait_running(deployment, client)
    hostile_traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions",
                              _key(world_a, hostile))  # fmt: skip
    thread = threading.Thread(target=neighbour.run, daemon=True)
    thread.start()
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES)
    worker.start()
    verdicts = {}
    try:
        steady = {"contract": False, "probes": [{"sli": "error_rate", "max": 0.95}]}
        for fault, extra in [
            ("error_burst", {"traffic_share": 0.5}),
            ("gpu_memory_leak", {"replica_share": 1.0,
                                 "parameters": {"mb_per_s": 64, "max_mb": 128}}),
            ("replica_crash", {"replica_share": 1.0}),
        ]:  # fmt: skip
            run = _ended(_run(world_a, hostile, fault, steady_state=steady, **extra), 150)
            verdicts[fault] = (run.status, run.verdict)
            assert run.status in (DrillStatus.PASSED, DrillStatus.FAILED), _explain(run)
            if fault == "replica_crash":
                # Its replacement keeps the slot's hash alive; the dead one is still counted.
                assert run.detected_at is not None, _explain(run)
            hostile.refresh_from_db()
            assert hostile.current_revision.faults == {}  # reverted
    finally:
        hostile_traffic.close()
        neighbour.stop.set()
        thread.join(timeout=60)
    assert hostile_traffic.statuses, "the hostile tenant's own traffic never ran"
    assert neighbour.failures == [], neighbour.failures[:5]
    with capsys.disabled():
        print(f"\nhostile drills beside the neighbour: {verdicts}; neighbour "
              f"{len(neighbour.latencies)} requests, 0 failed, p99 {neighbour.p99() * 1000:.1f} "
              f"ms; hostile answers {dict(hostile_traffic.statuses)}")  # fmt: skip


def test_a_hostile_tenants_remediation_chains_are_bounded_and_stay_in_its_tenant(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    """Remediation chains are tenant-written automation: their size and pace are bounded
    (400 naming the field), and what they run acts on the contract's own deployment only,
    within the tenant's quota; another tenant's version is no fallback."""
    from serving.ops.remediation import services as remediation
    from serving.ops.remediation.models import RemediationStep
    from tests.serving.test_ops_loop import _version

    hostile = _served(world_a)
    api = world_a.client()
    url = f"/api/v1/deployments/{hostile.pk}/contract/"
    head = (
        "apiVersion: aiops.portal/v1\nkind: SlaContract\nmetadata: {name: sla}\nspec:\n"
        "  window: 30d\n  objectives: [{name: availability, sli: availability, target: 0.99}]\n"
        "  remediation:\n"
    )
    chain = "    - {{name: c{i}, when: {{objective: availability}}, steps: [{steps}]}}\n"
    attacks = {
        "spec.remediation": "".join(chain.format(i=i, steps="{action: notify}") for i in range(6)),
        "spec.remediation[0].steps": chain.format(i=0, steps=", ".join(["{action: notify}"] * 9)),
        "spec.remediation[0].steps[0].wait": chain.format(i=0, steps="{wait: 1s}"),
        "spec.remediation[0].steps[0].replicas": chain.format(
            i=0, steps="{action: scale_out, replicas: 100}"
        ),
    }
    for field_name, chains in attacks.items():
        answer = api.put(url, {"source": head + chains}, format="json")
        assert answer.status_code == 400, answer.content
        assert field_name in answer.json()["error"]["fields"], (field_name, answer.json())
    # What may be written still cannot reach past the tenant: the neighbour's version as a
    # fallback, more replicas than the quota holds.
    theirs = _version(world_b, "theirs")
    steps = (
        f"{{action: switch_to_fallback, version: {theirs.pk}}}, {{action: scale_out, replicas: 4}}"
    )
    accepted = api.put(url, {"source": head + chain.format(i=0, steps=steps)}, format="json")
    assert accepted.status_code == 200, accepted.content
    used = Deployment.objects.filter(tenant=world_a.tenant, deleted_at__isnull=True).count()
    Quota.objects.filter(tenant=world_a.tenant).update(max_replicas=used)
    before = hostile.current_revision
    neighbour = _served(world_b)
    neighbour_revisions = neighbour.revisions.count()
    [run_id] = remediation.remediation_start(
        tenant=world_a.tenant, deployment=hostile, group="stable", alert_kind="burn",
        alert_name="availability", alert_action="notify", incident_id=None, contract_version=None,
    )  # fmt: skip
    remediation.remediation_advance(run_id=run_id)
    fallback, scale = RemediationStep.objects.filter(run_id=run_id).order_by("index")
    assert fallback.status == "failed" and "version" in fallback.message, fallback.message
    assert scale.status == "skipped" and "quota" in scale.message, scale.message
    assert Deployment.objects.get(pk=hostile.pk).current_revision == before
    assert neighbour.revisions.count() == neighbour_revisions
