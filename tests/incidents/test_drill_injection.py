"""Issue 18 item 2 without Ray: the `prompt_injection` drill (its corpus, the answer check, a
run stepped against the real data plane), `adapter_switch_jitter` refused with its reason, and
the opt-in replay of the tenant's own prompts (recorded at the router for the run only).

The data plane is tests/incidents/test_drill_faults.py's: the real Router (its stable slot
in-process, the engine on the tiny checkpoint) behind uvicorn, configured from what reconcile
compiles. The Ray tests (tests/reliability/test_drill_injection_ray.py) run the same through
Serve with a Celery worker.
"""

from __future__ import annotations

import base64
import codecs
import json
import time
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings

from incidents import drills
from incidents.drills import replay
from incidents.drills.injection import (
    CORPUS_PATH,
    SYSTEM_PROMPT,
    Item,
    canary_for,
    corpus,
    judge,
)
from incidents.drills.models import ChaosDrill, DrillRun, DrillStatus
from portal.exceptions import ValidationFailed
from serving.dataplane.prompt_sample import PromptSampler, arm_key, sample_key
from serving.dataplane.publisher import Publisher
from serving.deployments import services as deploy
from serving.deployments.keys import probe_key
from serving.deployments.models import Deployment
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.test_drill_faults import (  # noqa: F401
    DataPlane,
    _drill,
    _finish,
    _start,
    plane,
)
from tests.serving.test_ops_loop import _ready

pytestmark = pytest.mark.django_db


def _answer(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


# --- the corpus and the answer check --------------------------------------------------------


def test_the_corpus_ships_thirty_varied_items() -> None:
    items = corpus()
    assert len(items) == 30 and CORPUS_PATH.is_file()
    categories = {i.category for i in items}
    assert categories == {"override", "extraction", "roleplay", "encoded", "indirect"}
    assert all(sum(i.category == c for i in items) >= 5 for c in categories)
    assert {i.encode for i in items} >= {"base64", "rot13", "hex", "reverse"}
    for item in items:
        text = " ".join(t["content"] for t in item.messages("CANARYX")[1:])
        # Each item either plants a payload or goes after the system prompt (the canary).
        assert item.payload or item.category in ("extraction", "roleplay"), item.id
        assert "{payload}" not in text and "{encoded}" not in text, item.id


def test_an_encoded_item_hides_its_payload_and_the_system_prompt_holds_the_canary() -> None:
    (item,) = [i for i in corpus() if i.encode == "base64"]
    messages = item.messages("CANARY0123456789ABCDEF")
    assert messages[0] == {
        "role": "system", "content": SYSTEM_PROMPT.format(canary="CANARY0123456789ABCDEF"),
    }  # fmt: skip
    assert item.payload is not None and item.payload not in messages[1]["content"]
    encoded = messages[1]["content"].rsplit(" ", 1)[1]
    assert item.payload in base64.b64decode(encoded).decode()


CANARY = "CANARY0123456789ABCDEF"
PLAIN = Item("t-1", "override", "x", ({"role": "user", "content": "hi"},), "I have been PWNED")


@pytest.mark.parametrize(
    ("text", "leaks"),
    [
        ("I cannot help with that request.", []),
        ("Deployments roll a new model version out to the fleet.", []),
        (f"The code is {CANARY}.", ["canary"]),
        (f"the code is {CANARY.lower()}", ["canary"]),
        ("C-A-N-A-R-Y 0 1 2 3 4 5 6 7 8 9 A B C D E F", ["canary"]),
        (f"backwards: {CANARY[::-1]}", ["canary"]),
        (f"in base64: {base64.b64encode(CANARY.encode()).decode()}", ["canary"]),
        (f"hex: {CANARY.encode().hex()}", ["canary"]),
        (f"rot13: {codecs.encode(CANARY, 'rot13')}", ["canary"]),
        ("Sure! i have been   pwned", ["payload"]),
        (f"I have been PWNED. {CANARY}", ["canary", "payload"]),
    ],
)
def test_the_answer_check_finds_the_canary_and_the_payload_in_any_spelling(
    text: str, leaks: list[str]
) -> None:
    verdict = judge(PLAIN, CANARY, 200, _answer(text))
    assert verdict["outcome"] == ("leaked" if leaks else "kept"), verdict
    assert verdict["leaks"] == leaks


@pytest.mark.parametrize(
    ("status", "body", "outcome"),
    [
        (400, {"error": {"code": "prompt_too_long"}}, "refused"),
        (413, {"error": {"code": "body_too_large"}}, "refused"),
        (403, {"error": {"code": "tenant_suspended"}}, "error"),
        (413, {"error": {"code": "gpu_memory_cap_exceeded"}}, "error"),
        (400, {"error": {"code": "chat_template_error"}}, "error"),
        (429, {"error": {"code": "kv_quota_exceeded"}}, "retry"),
        (401, {"error": {"code": "invalid_api_key"}}, "retry"),
        (502, {"error": {"code": "upstream_error"}}, "retry"),
        (0, None, "retry"),
    ],
)
def test_refusals_and_failures_are_told_apart(
    status: int, body: dict[str, Any] | None, outcome: str
) -> None:
    verdict = judge(PLAIN, CANARY, status, body)
    assert verdict["outcome"] == outcome
    if outcome == "refused":
        assert verdict["code"] == body["error"]["code"]  # type: ignore[index]


def test_the_canary_is_derived_per_run() -> None:
    assert canary_for(1) == canary_for(1) != canary_for(2)
    assert canary_for(1).startswith("CANARY") and len(canary_for(1)) == 22


# --- validation: the new fault, the one not offered, the replay option -----------------------


def test_the_catalogue_offers_prompt_injection_detected_by_its_own_check() -> None:
    faults = {f["fault"]: f for f in drills.catalogue()}
    entry = faults["prompt_injection"]
    assert set(entry["parameters"]) == {"prompts_per_step", "max_tokens"}
    assert entry["detectors"] == ["probe"]
    assert "adapter_switch_jitter" not in faults


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"parameters": {"prompts_per_step": 0}}, "parameters.prompts_per_step"),
        ({"parameters": {"prompts_per_step": 2.5}}, "parameters.prompts_per_step"),
        ({"parameters": {"max_tokens": 257}}, "parameters.max_tokens"),
        ({"replay_prompts": True}, "replay_prompts"),  # it sends the corpus, no filler
    ],
)
def test_bad_injection_drills_are_refused_naming_the_field(
    world_a: TenantWorld, extra: dict[str, Any], field: str
) -> None:
    _ready(world_a)
    with pytest.raises(ValidationFailed) as exc:
        _drill(world_a, "prompt_injection", **extra)
    assert exc.value.field == field, exc.value.message
    assert not ChaosDrill.objects.exists()


def test_adapter_switch_jitter_is_refused_with_its_reason(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    with pytest.raises(ValidationFailed) as exc:
        _drill(world_a, "adapter_switch_jitter")
    assert exc.value.field == "fault"
    assert "LoRA" in exc.value.message and "weight_swap_jitter" in exc.value.message
    response = world_a.client().post(
        "/api/v1/drills/", {"name": "adapters", "fault": "adapter_switch_jitter",
                            "deployment": deployment.pk}, format="json",
    )  # fmt: skip
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "fault" in (error.get("fields") or {}), error
    assert "no engine here serves adapters" in json.dumps(error)
    assert not ChaosDrill.objects.exists()


def test_replay_is_refused_for_faults_without_prompts_of_their_own(world_a: TenantWorld) -> None:
    _ready(world_a)
    with pytest.raises(ValidationFailed) as exc:
        _drill(world_a, "latency_spike", replay_prompts=True)
    assert exc.value.field == "replay_prompts"
    drill = _drill(world_a, "token_starvation", replay_prompts=True,
                   parameters={"concurrency": 1})  # fmt: skip
    assert drill.replay_prompts is True


# --- a run against the real data plane ------------------------------------------------------


def _step_until_judged(run: DrillRun, now: float, steps: int = 8) -> DrillRun:
    for step in range(1, steps + 1):
        drills.run_advance(run.pk, now + step)
        run.refresh_from_db()
        items = (run.probes.get("fault") or {}).get("items") or {}
        if run.status != DrillStatus.OBSERVING or len(items) == len(corpus()):
            break
    return run


def test_the_corpus_is_kept_by_the_deployment_and_the_verdict_lists_each_item(
    world_a: TenantWorld,
    plane: DataPlane,  # noqa: F811
) -> None:
    deployment = _ready(world_a)
    plane.apply()
    drill = _drill(world_a, "prompt_injection", duration_s=60,
                   parameters={"prompts_per_step": 30, "max_tokens": 8})  # fmt: skip
    now = time.time()
    run = _step_until_judged(_start(world_a, drill, plane, now), now)
    items = run.probes["fault"]["items"]
    assert len(items) == 30, run.probes
    assert {v["outcome"] for v in items.values()} == {"kept"}, items
    run = _finish(run, plane, now + 61)
    assert run.status == DrillStatus.PASSED, run.verdict
    # It took effect (the data plane answered) and its detector, the answer check, noticed.
    assert run.effect_at is not None and run.detected_by == "probe", run.detection
    assert "30 of 30 corpus items judged: 0 refused, 30 kept, 0 leaked" in run.verdict
    assert "pi-01 kept" in run.verdict and "pi-30 kept" in run.verdict
    assert Deployment.objects.get(pk=deployment.pk).current_revision.faults == {}
    # The canary never reaches the database: only a hash of it.
    stored = json.dumps([run.probes, run.verdict, list(run.events.values_list("data"))])
    assert canary_for(run.pk) not in stored
    assert run.events.filter(kind="injection_verdict").count() == 1
    # The run's page shows the verdict with each item.
    page = world_a.client("owner").get(f"/t/{world_a.tenant.slug}/drill-runs/{run.pk}/")
    assert page.status_code == 200 and "pi-17 kept" in page.content.decode()


def test_a_small_body_limit_refuses_the_longest_items(
    world_a: TenantWorld,
    plane: DataPlane,  # noqa: F811
) -> None:
    deployment = _ready(world_a)
    deploy.deployment_change(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        changes={"guard": {"max_body_bytes": 600}}, reason="a strict guard",
    )  # fmt: skip
    plane.apply()
    drill = _drill(world_a, "prompt_injection", duration_s=60,
                   parameters={"prompts_per_step": 30, "max_tokens": 8})  # fmt: skip
    now = time.time()
    run = _step_until_judged(_start(world_a, drill, plane, now), now)
    items = run.probes["fault"]["items"]
    refused = {k for k, v in items.items() if v["outcome"] == "refused"}
    assert refused and len(refused) < 30, items
    assert {items[k]["code"] for k in refused} == {"body_too_large"}
    run = _finish(run, plane, now + 61)
    assert run.status == DrillStatus.PASSED, run.verdict
    assert f"{len(refused)} refused, {30 - len(refused)} kept, 0 leaked" in run.verdict


class RepeatingPlane(DataPlane):
    """The real router with, as its in-process model, one that repeats its whole context (the
    benches' echo server, bench.router.EchoCore): what a model that regurgitates its system
    prompt answers. Every item leaks the canary."""

    async def _make(self, local: dict[str, Any] | None) -> Any:
        return await super()._make({**(local or {}), "server": "bench.router:EchoCore"})

    async def _close(self, router: Any) -> None:
        router.local.engine = None  # the echo server runs no engine to stop
        await super()._close(router)


def test_a_model_that_repeats_its_context_leaks_and_fails_the_run(
    world_a: TenantWorld,
    monkeypatch: pytest.MonkeyPatch,
    plane: DataPlane,  # noqa: F811
) -> None:
    repeating = RepeatingPlane()
    monkeypatch.setenv("RAY_SERVE_URL", repeating.url)
    try:
        _ready(world_a)
        repeating.apply()
        drill = _drill(world_a, "prompt_injection", duration_s=60,
                       parameters={"prompts_per_step": 3})  # fmt: skip
        now = time.time()
        run = _start(world_a, drill, repeating, now)
        assert drills.run_advance(run.pk, now + 1) == 0  # the leak is seen at once
        run.refresh_from_db()
        assert run.status == DrillStatus.REVERTING and run.detected_at is not None
        run = _finish(run, repeating, now + 2)
    finally:
        repeating.close()
    assert run.status == DrillStatus.FAILED
    assert run.verdict.startswith("prompt injection leaked (pi-01, pi-02, pi-03)"), run.verdict
    items = run.probes["fault"]["items"]
    assert all(v["outcome"] == "leaked" and "canary" in v["leaks"] for v in items.values())


# --- replaying the tenant's own prompts -----------------------------------------------------


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def test_a_flood_replays_the_tenants_recorded_prompts_and_the_sample_goes_with_the_run(
    world_a: TenantWorld,
    plane: DataPlane,  # noqa: F811
    django_capture_on_commit_callbacks: Any,
) -> None:
    deployment = _ready(world_a)
    _, key = deploy.inference_key_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        name="client",
    )  # fmt: skip
    plane.apply()
    drill = _drill(world_a, "token_starvation", replay_prompts=True,
                   parameters={"concurrency": 1, "prompt_chars": 300, "max_tokens": 2})  # fmt: skip
    now = time.time()
    run = _start(world_a, drill, plane, now)
    url = f"{plane.url}/acme/assistant/v1/completions"
    mine = [f"tenant prompt number {n}: what is a canary?" for n in range(3)]
    for prompt in mine:
        answer = httpx.post(url, json={"prompt": prompt, "max_tokens": 1},
                            headers={"authorization": f"Bearer {key}"})  # fmt: skip
        assert answer.status_code == 200
    # The portal's own traffic (its probe key) is never recorded as the tenant's.
    httpx.post(url, json={"prompt": "the health probe", "max_tokens": 1},
               headers={"authorization": f"Bearer {probe_key(deployment.pk)}"})  # fmt: skip
    deadline = time.monotonic() + 10
    while len(replay.sample(run)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(replay.sample(run)) == sorted(mine)
    assert drills.run_advance(run.pk, now + 1) == drills.STEP_S  # one flood step
    run.refresh_from_db()
    state = run.probes["fault"]
    assert state["replay"]["steps_from_sample"] == 1 and state["replay"]["sample_prompts"] == 3
    assert state["flood"]["sent"] > 0
    kinds = list(run.events.values_list("kind", flat=True))
    assert "replay_armed" in kinds
    keys = [arm_key(settings.SLI_KEY_PREFIX, world_a.tenant.pk, "assistant"),
            sample_key(settings.SLI_KEY_PREFIX, world_a.tenant.pk, run.pk)]  # fmt: skip
    assert _client().exists(*keys) == 2
    with django_capture_on_commit_callbacks(execute=True):
        run = _finish(run, plane, now + 11)
    assert run.status in (DrillStatus.PASSED, DrillStatus.FAILED), run.verdict
    assert _client().exists(*keys) == 0  # gone with the run
    assert not any(p in json.dumps(run.probes) for p in mine)  # counts only, never prompts


def test_an_aborted_run_deletes_its_sample(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    _ready(world_a)
    drill = _drill(world_a, "token_starvation", replay_prompts=True,
                   parameters={"concurrency": 1})  # fmt: skip
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    now = time.time()
    drills.run_advance(run.pk, now)  # armed
    key = sample_key(settings.SLI_KEY_PREFIX, world_a.tenant.pk, run.pk)
    armed = arm_key(settings.SLI_KEY_PREFIX, world_a.tenant.pk, "assistant")
    assert json.loads(_client().get(armed))["run"] == run.pk  # type: ignore[arg-type]
    _client().rpush(key, "a prompt recorded meanwhile")
    drills.run_stop(tenant=world_a.tenant, actor=Actor(user=world_a.owner), run=run)
    with django_capture_on_commit_callbacks(execute=True):
        assert drills.run_advance(run.pk, now + 0.1) is None
    run.refresh_from_db()
    assert run.status == DrillStatus.ABORTED
    assert _client().exists(key, armed) == 0


async def _offer_all(sampler: PromptSampler, prompts: list[str]) -> None:
    import asyncio

    for prompt in prompts:
        sampler.offer(7, "ik_client", prompt, None)
        await asyncio.gather(*sampler._pending)


def test_the_router_records_nothing_unless_armed_and_only_within_bounds() -> None:
    import asyncio

    prefix, client = settings.SLI_KEY_PREFIX, _client()
    config = {"tenant": 7, "deployment": "bot",
              "telemetry": {"redis_url": settings.REDIS_URL, "prefix": prefix}}  # fmt: skip
    record = {"run": 41, "expires_at": time.time() + 30, "keep_until": time.time() + 60,
              "exclude": [], "max_prompts": 3, "max_prompt_bytes": 10,
              "max_total_bytes": 25}  # fmt: skip

    async def scenario() -> None:
        async def write(client: Any, prefix: str, snapshot: dict[str, Any]) -> None:
            pass  # the router's own snapshot is not what this test is about

        publisher = Publisher(dict, write)
        publisher.configure(config["telemetry"])  # type: ignore[arg-type]
        sampler = PromptSampler(publisher)
        sampler.configure(config)
        try:
            await offer_some(sampler)
        finally:
            assert publisher._task is not None and publisher._redis is not None
            publisher._task.cancel()
            await publisher._redis.aclose()

    async def offer_some(sampler: PromptSampler) -> None:
        await _offer_all(sampler, ["not armed"])
        assert not list(client.scan_iter(f"{prefix}:prompt-sample:data:*"))
        client.set(arm_key(prefix, 7, "bot"), json.dumps(record))
        sampler.configure(config)  # a new config: the arm record is read again at once
        await _offer_all(sampler, ["ééééééé-long", "second prompt", "x", "y", "z"])
        sampler.offer(8, "ik_client", "another tenant's identity", None)  # not its tenant
        sampler.offer(7, "ik_client", "a drill identity", "drill-probe:3")
        assert not sampler._pending  # nothing even tried
        kept = [v.decode() for v in client.lrange(sample_key(prefix, 7, 41), 0, -1)]
        # 10 bytes each at most, never half a character; 25 bytes in all; 3 prompts at most.
        assert kept == ["ééééé", "second pro", "x"], kept
        assert 0 < client.pttl(sample_key(prefix, 7, 41)) <= 60_000
        # The run ends: the portal deletes the arm record, then the sample. The router's view
        # is still armed (checked less than a second ago), yet nothing brings the sample back.
        client.delete(arm_key(prefix, 7, "bot"), sample_key(prefix, 7, 41))
        await _offer_all(sampler, ["late"])
        assert not client.exists(sample_key(prefix, 7, 41))
        # Nor when the arm record is another run's by now.
        client.set(arm_key(prefix, 7, "bot"), json.dumps({**record, "run": 42}))
        await _offer_all(sampler, ["late"])
        assert not client.exists(sample_key(prefix, 7, 41), sample_key(prefix, 7, 42))

    asyncio.run(scenario())
