"""The chaos-drill fault catalogue (serving.dataplane.faults): validation that names the field,
and the injector as a replica runs it, on an injected clock and replica start time. No Ray:
the Serve side (a crash restarting a replica) is tests/serving/test_faults_ray.py."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from serving.dataplane.faults import (
    MAX_DELAY_MS,
    MB,
    NO_FAULTS,
    FaultInjector,
    FaultPlan,
    FaultSpecError,
    InjectedFault,
    LatencySpike,
    ReplicaHung,
    share_point,
    validate_faults,
    validate_group,
)
from tests.conftest import TenantWorld

T0 = 1_700_000_000.0  # "now" of the injected clock


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _injector(
    clock: Clock | None = None, *, started_at: float = T0 - 60, replica: str = "r-1", **kw: Any
) -> FaultInjector:
    return FaultInjector(
        replica, started_at=started_at, clock=clock or Clock(), rng=random.Random(7), **kw
    )


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# Validation ----------------------------------------------------------------------------------


def test_a_full_spec_is_normalized_with_defaults() -> None:
    raw = {
        "drill": "42",
        "issued_at": T0,
        "expires_at": T0 + 70,
        "error_rate": 0.1,
        "latency_ms": 20,
        "error_burst": {"share": 0.3},
        "latency_spike": {"delay_ms": 200, "distribution": "uniform", "jitter_ms": 50},
        "gpu_memory_leak": {"mb_per_s": 50},
        "replica_crash": {"after_s": 5},
        "replica_hang": {},
    }
    assert validate_group(raw, "faults.canary") == {
        "drill": "42",
        "issued_at": T0,
        "expires_at": T0 + 70,
        "error_rate": 0.1,
        "latency_ms": 20,
        "error_burst": {"share": 0.3, "status": 503},
        "latency_spike": {"delay_ms": 200.0, "jitter_ms": 50.0, "distribution": "uniform",
                          "share": 1.0},
        "gpu_memory_leak": {"mb_per_s": 50.0, "max_mb": 4096.0, "replica_share": 1.0},
        "replica_crash": {"replica_share": 1.0, "after_s": 5.0},
        "replica_hang": {"replica_share": 1.0},
    }  # fmt: skip


def test_the_original_two_faults_validate_as_before() -> None:
    clean = validate_faults({"canary": {"error_rate": 0.3, "latency_ms": 250}, "stable": {}})
    assert clean == {"canary": {"error_rate": 0.3, "latency_ms": 250}, "stable": {}}
    assert isinstance(clean["canary"]["latency_ms"], int)
    assert validate_faults(None) == {} and validate_faults({}) == {}


@pytest.mark.parametrize(
    ("faults", "field", "message"),
    [
        ({"blue": {}}, "faults", "per group"),
        ({"canary": []}, "faults.canary", "must be an object"),
        ({"canary": {"bogus": 1}}, "faults.canary.bogus", "unknown fault 'bogus'"),
        ({"canary": {"error_rate": 1.5}}, "faults.canary.error_rate", "at most 1.0"),
        ({"canary": {"error_rate": float("nan")}}, "faults.canary.error_rate", "finite"),
        ({"canary": {"latency_ms": 2.5}}, "faults.canary.latency_ms", "whole number"),
        ({"canary": {"error_burst": 0.3}}, "faults.canary.error_burst", "must be an object"),
        ({"canary": {"error_burst": {}}}, "faults.canary.error_burst.share", "required"),
        ({"canary": {"error_burst": {"share": True}}}, "faults.canary.error_burst.share",
         "must be a number"),
        ({"canary": {"error_burst": {"share": 0.5, "status": 404}}},
         "faults.canary.error_burst.status", "at least 500"),
        ({"canary": {"error_burst": {"share": 0.5, "status": 503.5}}},
         "faults.canary.error_burst.status", "whole number"),
        ({"canary": {"latency_spike": {"delay_ms": 10, "distribution": "gaussian"}}},
         "faults.canary.latency_spike.distribution", "fixed, uniform, exponential"),
        ({"canary": {"latency_spike": {"delay_ms": 700_000}}},
         "faults.canary.latency_spike.delay_ms", "at most 600000"),
        ({"canary": {"latency_spike": {"delay_ms": 10, "spread": 1}}},
         "faults.canary.latency_spike.spread", "unknown setting 'spread'"),
        ({"stable": {"gpu_memory_leak": {"mb_per_s": 0}}},
         "faults.stable.gpu_memory_leak.mb_per_s", "greater than 0"),
        ({"stable": {"gpu_memory_leak": {"mb_per_s": 5, "max_mb": 2_000_000}}},
         "faults.stable.gpu_memory_leak.max_mb", "at most 1000000"),
        ({"stable": {"replica_crash": {}}}, "faults.stable.issued_at", "required with"),
        ({"stable": {"replica_hang": {}, "issued_at": T0, "expires_at": T0}},
         "faults.stable.expires_at", "later than issued_at"),
        ({"stable": {"replica_crash": {"after_s": 4000}, "issued_at": T0}},
         "faults.stable.replica_crash.after_s", "at most 3600"),
        ({"stable": {"replica_hang": {"replica_share": -0.1}, "issued_at": T0}},
         "faults.stable.replica_hang.replica_share", "at least 0.0"),
        ({"stable": {"drill": 7}}, "faults.stable.drill", "string"),
        ({"stable": {"issued_at": T0 * 1000}}, "faults.stable.issued_at", "at most"),  # ms
    ],
)  # fmt: skip
def test_a_bad_fault_is_refused_naming_the_field(faults: Any, field: str, message: str) -> None:
    with pytest.raises(FaultSpecError) as exc:
        validate_faults(faults)
    assert exc.value.field == field
    assert message in exc.value.message, exc.value.message


def test_a_bad_config_reaching_a_replica_is_ignored_not_raised() -> None:
    injector = _injector()
    injector.configure({"error_burst": {"share": 2}})
    assert injector.plan == NO_FAULTS and injector.failure() is None
    assert "faults.error_burst.share" in (injector.snapshot()["error"] or "")


# Request faults ------------------------------------------------------------------------------


def test_error_shares_hold_and_a_burst_carries_its_status() -> None:
    injector = _injector()
    injector.configure({"drill": "9", "error_burst": {"share": 0.3, "status": 504}})
    failures = [injector.failure() for _ in range(10_000)]
    bursts = [f for f in failures if f is not None]
    assert 2_800 <= len(bursts) <= 3_200  # 3000 +- 4.4 sigma
    assert all(isinstance(f, InjectedFault) and f.status == 504 for f in bursts)
    assert str(bursts[0]) == "injected fault: error_burst (drill 9)"
    # The original error_rate fails as before: a plain RuntimeError (the router's 502).
    injector.configure({"error_rate": 0.1})
    rates = [injector.failure() for _ in range(10_000)]
    plain = [f for f in rates if f is not None]
    assert 850 <= len(plain) <= 1_150
    assert all(type(f) is RuntimeError and str(f) == "injected fault: error_rate" for f in plain)
    injector.configure({"error_burst": {"share": 0.0}})
    assert all(injector.failure() is None for _ in range(1_000))


def test_an_injected_fault_survives_pickling_with_its_status() -> None:
    fault = pickle.loads(pickle.dumps(InjectedFault(507, "error_burst", "3")))  # noqa: S301 (our own bytes, as Ray moves them)
    assert (fault.status, fault.kind, fault.drill) == (507, "error_burst", "3")
    assert fault.message == "injected fault: error_burst (drill 3)"


@pytest.mark.parametrize(
    ("spike", "low", "high", "mean"),
    [
        (LatencySpike(200), 200, 200, 200),
        (LatencySpike(200, jitter_ms=50, distribution="uniform"), 150, 250, 200),
        (LatencySpike(20, jitter_ms=50, distribution="uniform"), 0, 70, 35),  # floored at 0
        (LatencySpike(100, jitter_ms=999, distribution="fixed"), 100, 100, 100),  # no jitter
        (LatencySpike(100, distribution="exponential"), 0, MAX_DELAY_MS, 100),
        (LatencySpike(0, distribution="exponential"), 0, 0, 0),
    ],
)
def test_latency_distributions_stay_in_range(
    spike: LatencySpike, low: float, high: float, mean: float
) -> None:
    rng = random.Random(11)
    samples = [spike.sample_ms(rng) for _ in range(20_000)]
    assert low <= min(samples) and max(samples) <= high
    assert statistics.fmean(samples) == pytest.approx(mean, rel=0.05, abs=0.5)


def test_exponential_delays_are_capped_at_the_schema_maximum() -> None:
    spike = LatencySpike(MAX_DELAY_MS, distribution="exponential")
    samples = [spike.sample_ms(random.Random(seed)) for seed in range(2_000)]
    assert max(samples) == MAX_DELAY_MS and min(samples) >= 0


def test_a_latency_spike_hits_its_share_and_adds_to_latency_ms() -> None:
    injector = _injector()
    injector.configure({"latency_ms": 10, "latency_spike": {"delay_ms": 200, "share": 0.25}})
    delays = [injector.delay_s() for _ in range(10_000)]
    assert set(delays) == {0.01, 0.21}
    assert 2_300 <= delays.count(0.21) <= 2_700


def test_before_request_waits_then_fails() -> None:
    injector = _injector()
    injector.configure({"latency_spike": {"delay_ms": 30}, "error_burst": {"share": 1}})
    started = time.monotonic()
    with pytest.raises(InjectedFault) as exc:
        asyncio.run(injector.before_request())
    assert time.monotonic() - started >= 0.03
    assert exc.value.status == 503


# TTL -----------------------------------------------------------------------------------------


def test_every_fault_of_the_group_ends_at_expires_at() -> None:
    clock = Clock()
    injector = _injector(clock)
    injector.configure({
        "drill": "5", "issued_at": T0, "expires_at": T0 + 30, "error_rate": 1.0,
        "latency_ms": 100, "error_burst": {"share": 1}, "latency_spike": {"delay_ms": 50},
        "replica_hang": {},
    })  # fmt: skip
    assert injector.failure() is not None and injector.delay_s() == pytest.approx(0.15)
    assert injector.hung()
    clock.now = T0 + 29.999
    assert injector.hung() and injector.snapshot()["active"]
    clock.now = T0 + 30
    assert injector.failure() is None and injector.delay_s() == 0 and not injector.hung()
    injector.check_health()  # no longer raises
    snapshot = injector.snapshot()
    assert snapshot["expired"] and snapshot["active"] == [] and snapshot["drill"] == "5"


# Memory leak ---------------------------------------------------------------------------------


def test_the_leak_grows_at_its_rate_up_to_max_and_is_freed_on_removal() -> None:
    clock = Clock()
    injector = _injector(clock, leak_device="host", leak_tick_s=0.005)
    leak_spec = {"drill": "1", "gpu_memory_leak": {"mb_per_s": 10, "max_mb": 48}}

    async def scenario() -> None:
        before = _resident_bytes()
        injector.configure(leak_spec)
        leak = injector.leak
        assert leak is not None and leak.running
        await asyncio.sleep(0.02)
        assert injector.leaked_mb == 0  # no time has passed on the clock
        clock.now += 1.0
        await _until(lambda: injector.leaked_mb == 10)
        clock.now += 2.0
        await _until(lambda: injector.leaked_mb == 30)
        # A reconfigure for something else (traffic, keys) leaves the leak running.
        injector.configure(dict(leak_spec))
        assert injector.leak is leak and injector.leaked_mb == 30
        clock.now += 100
        await _until(lambda: injector.leaked_mb == 48)
        await asyncio.sleep(0.05)
        assert injector.leaked_mb == 48  # capped
        assert injector.snapshot()["fault_leaked_mb"] == 48
        # Really resident: the pages were written.
        assert _resident_bytes() - before >= 40 * MB
        injector.configure({})
        assert injector.leak is None and injector.leaked_mb == 0
        await asyncio.sleep(0.02)
        assert not leak.running and leak.leaked_bytes == 0
        assert _resident_bytes() - before < 20 * MB  # handed back

    asyncio.run(scenario())


def test_the_leak_follows_the_real_clock() -> None:
    injector = FaultInjector("r-1", leak_device="host", leak_tick_s=0.01)

    async def scenario() -> None:
        started = time.time()
        injector.configure({"gpu_memory_leak": {"mb_per_s": 40, "max_mb": 1000}})
        await asyncio.sleep(0.5)
        elapsed = time.time() - started
        # Never faster than the rate; about the rate (a loaded CI machine may lag a tick).
        assert 0.5 * 40 * elapsed <= injector.leaked_mb <= 40 * elapsed + 1
        injector.close()
        assert injector.leaked_mb == 0

    asyncio.run(scenario())


def test_the_leak_stops_and_frees_itself_at_expiry() -> None:
    clock = Clock()
    injector = _injector(clock, leak_device="host", leak_tick_s=0.005)

    async def scenario() -> None:
        injector.configure({"issued_at": T0, "expires_at": T0 + 5,
                            "gpu_memory_leak": {"mb_per_s": 4}})  # fmt: skip
        leak = injector.leak
        assert leak is not None
        clock.now += 2
        await _until(lambda: injector.leaked_mb == 8)
        clock.now = T0 + 5  # nobody reverted it: the TTL does
        await _until(lambda: not leak.running)
        assert injector.leaked_mb == 0 and leak.leaked_bytes == 0
        # The same (expired) config again starts nothing.
        injector.configure({"issued_at": T0, "expires_at": T0 + 5,
                            "gpu_memory_leak": {"mb_per_s": 4}})  # fmt: skip
        assert injector.leak is None

    asyncio.run(scenario())


# Crash and hang ------------------------------------------------------------------------------


def test_selection_spares_replicas_started_after_issued_at() -> None:
    plan = FaultPlan.parse({"drill": "8", "issued_at": T0, "replica_hang": {}})
    old = _injector(started_at=T0 - 1)
    new = _injector(started_at=T0)  # Serve's replacement: started at/after the drill
    assert old.selected(1.0, plan) and not new.selected(1.0, plan)
    assert not old.selected(0.0, plan)
    no_time = FaultPlan.parse({"drill": "8", "gpu_memory_leak": {"mb_per_s": 1}})
    assert not old.selected(1.0, no_time)  # no issued_at: nobody


def test_replica_share_picks_a_deterministic_share_of_replicas() -> None:
    replicas = [f"replica-{i}" for i in range(2_000)]
    points = [share_point("drill-3", r) for r in replicas]
    assert points == [share_point("drill-3", r) for r in replicas]  # the same every time
    assert all(0 <= p < 1 for p in points)
    assert 880 <= sum(p < 0.5 for p in points) <= 1_120
    assert 160 <= sum(p < 0.1 for p in points) <= 240
    # Another drill picks another set.
    other = [share_point("drill-4", r) < 0.5 for r in replicas]
    assert other != [p < 0.5 for p in points]
    plan = FaultPlan.parse({"drill": "drill-3", "issued_at": T0, "replica_hang": {}})
    chosen = [r for r in replicas if _injector(replica=r).selected(0.5, plan)]
    assert chosen == [r for r, p in zip(replicas, points, strict=True) if p < 0.5]


def test_a_hung_replica_fails_its_health_check_until_the_fault_goes() -> None:
    clock = Clock()
    spec = {"drill": "2", "issued_at": T0, "expires_at": T0 + 60,
            "replica_hang": {"replica_share": 0.5}}  # fmt: skip
    replicas = [_injector(clock, replica=f"r-{i}") for i in range(40)]
    for injector in replicas:
        injector.configure(spec)
    hung = [i for i in replicas if i.hung()]
    assert 0 < len(hung) < 40
    for injector in replicas:
        if injector in hung:
            with pytest.raises(ReplicaHung, match="replica_hang"):
                injector.check_health()
        else:
            injector.check_health()
    hung[0].configure({})
    hung[0].check_health()
    late = _injector(clock, started_at=T0 + 1, replica=hung[1].replica)
    late.configure(spec)
    late.check_health()  # the replacement of a hung replica is healthy


def test_a_selected_replica_exits_after_after_s_from_a_background_task() -> None:
    clock = Clock()
    exits: list[int] = []
    injector = _injector(clock, exit_process=exits.append)
    spec = {"drill": "4", "issued_at": T0 - 2.0, "replica_crash": {"after_s": 2.05}}

    async def scenario() -> None:
        injector.configure(spec)
        assert injector.crash_pending and exits == []
        injector.configure(dict(spec))  # unrelated reconfigure: still the same countdown
        await _until(lambda: exits == [1])
        assert not injector.crash_pending

    asyncio.run(scenario())


@pytest.mark.parametrize("case", ["started_after", "share_0", "removed", "expired", "no_drill"])
def test_a_crash_spares_who_it_should(case: str) -> None:
    clock = Clock()
    exits: list[int] = []
    started = T0 + 1 if case == "started_after" else T0 - 60
    injector = _injector(clock, started_at=started, exit_process=exits.append)
    spec: dict[str, Any] = {"drill": "4", "issued_at": T0, "expires_at": T0 + 0.05,
                            "replica_crash": {"after_s": 0.05}}  # fmt: skip
    if case == "share_0":
        spec["replica_crash"]["replica_share"] = 0.0
    if case == "no_drill":
        spec = {"issued_at": T0, "replica_crash": {"after_s": 0.05}}

    async def scenario() -> None:
        injector.configure(spec)
        if case == "removed":
            await asyncio.sleep(0.01)
            injector.configure({})
        if case == "expired":
            clock.now = T0 + 0.05
        await asyncio.sleep(0.15)

    asyncio.run(scenario())
    assert exits == ([1] if case == "no_drill" else [])  # without a drill id: still its share


# Through the service layer (the only way faults reach a revision) -----------------------------


@pytest.mark.django_db
def test_deployment_change_refuses_a_bad_fault_naming_the_field(world_a: TenantWorld) -> None:
    from portal.exceptions import ValidationFailed
    from serving.deployments import services as deployments
    from serving.deployments.models import Deployment
    from tenants.actors import Actor

    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    change = partial(deployments.deployment_change, tenant=world_a.tenant,
                     actor=Actor(user=world_a.owner), deployment=deployment, reason="drill")  # fmt: skip
    bad = {"stable": {"latency_spike": {"delay_ms": 5, "distribution": "gaussian"}}}
    with pytest.raises(ValidationFailed) as exc:
        change(changes={"faults": bad})
    assert exc.value.field == "faults.stable.latency_spike.distribution"
    with pytest.raises(ValidationFailed) as exc:
        change(changes={"faults": {"stable": {"disk_full": {}}}})
    assert exc.value.field == "faults.stable.disk_full"
    revision = change(changes={"faults": {"stable": {
        "drill": "12", "issued_at": T0, "expires_at": T0 + 90, "replica_crash": {"after_s": 3},
    }}})  # fmt: skip
    assert revision.faults == {"stable": {
        "drill": "12", "issued_at": T0, "expires_at": T0 + 90,
        "replica_crash": {"replica_share": 1.0, "after_s": 3.0},
    }}  # fmt: skip


# The router's answer -------------------------------------------------------------------------


def test_the_router_answers_an_error_burst_with_its_status(tmp_path: Path) -> None:
    """The real Router with its stable slot in-process (a real VersionCore on a tiny
    checkpoint, no Ray): an error burst answers its 5xx, error_rate stays a 502, and both
    count against the breaker and in the slot's SLI window as the version's errors."""
    from starlette.requests import Request

    from serving.dataplane.app import Router
    from serving.dataplane.keys import hash_key
    from serving.engine.testing import write_tiny_checkpoint

    artifact = str(write_tiny_checkpoint(tmp_path / "tiny"))
    router = Router.func_or_class(local={"app": "acme.chat", "engine": {"num_blocks": 16}})
    local = {"version": "v1", "artifact": artifact, "tenants": {"7": {"salt": "ab" * 32}}}
    config = {"tenant": "7", "deployment": "chat", "key_hashes": [hash_key("k")],
              "groups": {"stable": {"app": "acme.chat", "version": "v1", "local": True}},
              "breaker": {"min_requests": 1000}}  # fmt: skip

    async def post() -> tuple[int, Any]:
        async def receive() -> dict[str, Any]:
            body = b'{"prompt": "hi", "max_tokens": 1}'
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "",
                 "headers": [(b"authorization", b"Bearer k")], "query_string": b""}  # fmt: skip
        response = await router(Request(scope, receive))
        return response.status_code, json.loads(bytes(response.body))

    async def scenario() -> None:
        burst = {"drill": "6", "error_burst": {"share": 1, "status": 507}}
        await router.reconfigure({**config, "local": {**local, "faults": burst}})
        status, body = await post()
        assert status == 507, body
        message = body["error"]["message"]
        assert message == "model version failed: injected fault: error_burst (drill 6)"
        await router.reconfigure({**config, "local": {**local, "faults": {"error_rate": 1.0}}})
        assert (await post())[0] == 502
        await router.reconfigure({**config, "local": {**local, "faults": {}}})
        assert (await post())[0] == 200
        router.local.chaos.close()

    asyncio.run(scenario())
    window = router.local.recorder.current
    assert (window.requests, window.errors, window.rejected) == (3, 2, 0)
    assert router._breaker("stable").snapshot()["failure_rate"] == pytest.approx(2 / 3, abs=1e-3)
    assert router.version_stats()["faults"]["active"] == []


# The KV pollution probe and forced reloads ---------------------------------------------------

PROBE_HASH = "c0" * 32


@pytest.mark.parametrize(
    ("faults", "field", "message"),
    [
        ({"stable": {"kv_pollution_probe": {"identity": "drill-probe:1", "key_hash": PROBE_HASH}}},
         "faults.stable.expires_at", "required with kv_pollution_probe"),
        ({"stable": {"expires_at": T0, "kv_pollution_probe": {"key_hash": PROBE_HASH}}},
         "faults.stable.kv_pollution_probe.identity", "required"),
        ({"stable": {"expires_at": T0, "kv_pollution_probe": {"identity": "7",
                                                               "key_hash": PROBE_HASH}}},
         "faults.stable.kv_pollution_probe.identity", "drill-probe:<run>"),
        ({"stable": {"expires_at": T0, "kv_pollution_probe": {"identity": "drill-probe:1",
                                                               "key_hash": "k"}}},
         "faults.stable.kv_pollution_probe.key_hash", "64 hex digits"),
        ({"stable": {"expires_at": T0, "kv_pollution_probe": {
            "identity": "drill-probe:1", "key_hash": PROBE_HASH, "quota_blocks": 0}}},
         "faults.stable.kv_pollution_probe.quota_blocks", "at least 1"),
        ({"canary": {"expires_at": T0, "kv_pollution_probe": {"identity": "drill-probe:1",
                                                               "key_hash": PROBE_HASH}}},
         "faults.canary.kv_pollution_probe", "only the stable slot"),
        ({"stable": {"weight_swap_jitter": {}}}, "faults.stable.weight_swap_jitter.reload",
         "required"),
        ({"stable": {"weight_swap_jitter": {"reload": 1.5}}},
         "faults.stable.weight_swap_jitter.reload", "whole number"),
        ({"stable": {"weight_swap_jitter": {"reload": 0}}},
         "faults.stable.weight_swap_jitter.reload", "at least 1"),
    ],
)  # fmt: skip
def test_a_bad_probe_or_reload_is_refused_naming_the_field(
    faults: Any, field: str, message: str
) -> None:
    with pytest.raises(FaultSpecError) as exc:
        validate_faults(faults)
    assert exc.value.field == field
    assert message in exc.value.message, exc.value.message


def test_probe_and_reload_specs_are_normalized() -> None:
    clean = validate_faults({"stable": {
        "drill": "3", "issued_at": T0, "expires_at": T0 + 70,
        "kv_pollution_probe": {"identity": "drill-probe:3", "key_hash": PROBE_HASH},
        "weight_swap_jitter": {"reload": 2},
    }})  # fmt: skip
    assert clean["stable"]["kv_pollution_probe"] == {
        "identity": "drill-probe:3", "key_hash": PROBE_HASH, "quota_blocks": 16,
    }  # fmt: skip
    assert clean["stable"]["weight_swap_jitter"] == {"reload": 2}
    plan = FaultPlan.parse(clean["stable"])
    assert plan.kinds == ["kv_pollution_probe", "weight_swap_jitter"]


def test_the_probe_identity_exists_only_while_its_fault_is_in_force() -> None:
    clock = Clock()
    injector = _injector(clock)
    salts = {"7": b"\x01" * 32}
    assert injector.probe_identity(PROBE_HASH) is None
    injector.configure({"drill": "3", "issued_at": T0, "expires_at": T0 + 30,
                        "kv_pollution_probe": {"identity": "drill-probe:3",
                                               "key_hash": PROBE_HASH, "quota_blocks": 4},
                        "weight_swap_jitter": {"reload": 5}})  # fmt: skip
    assert injector.probe_identity(PROBE_HASH) == "drill-probe:3"
    assert injector.probe_identity("d0" * 32) is None and injector.probe_identity(None) is None
    salt, quota = injector.probe_tenant("drill-probe:3", salts) or (b"", 0)
    assert quota == 4 and len(salt) == 32 and salt != salts["7"]
    # The same on every replica (derived, not random), and another tenant set gives another.
    assert injector.probe_tenant("drill-probe:3", dict(salts)) == (salt, 4)
    assert injector.probe_tenant("drill-probe:3", {"8": b"\x02" * 32}) != (salt, 4)
    assert injector.probe_tenant("7", salts) is None  # a real tenant is not the probe
    assert injector.reload_key() == ("3", T0, 5)
    clock.now = T0 + 30  # the TTL: the key is refused, the identity has no salt any more
    assert injector.probe_identity(PROBE_HASH) is None
    assert injector.probe_tenant("drill-probe:3", salts) is None
    assert injector.reload_key() is None


class _LocalRouter:
    """The real Router with its stable slot in-process (a VersionCore on a tiny checkpoint),
    driven without Ray or HTTP: what Serve does is calling reconfigure() and __call__."""

    KEY, PROBE_KEY = "k-tenant", "k-drill-probe"

    def __init__(self, tmp_path: Path) -> None:
        from serving.dataplane.app import Router
        from serving.engine.testing import write_tiny_checkpoint

        self.router = Router.func_or_class(local={"app": "acme.chat", "engine": {"num_blocks": 64}})
        artifact = str(write_tiny_checkpoint(tmp_path / "tiny"))
        self.local = {"version": "v1", "artifact": artifact, "fingerprint": "fp-1",
                      "tenants": {"7": {"salt": "ab" * 32}}}  # fmt: skip

    async def configure(self, faults: dict[str, Any]) -> None:
        from serving.dataplane.keys import hash_key

        await self.router.reconfigure({
            "tenant": "7", "deployment": "chat", "key_hashes": [hash_key(self.KEY)],
            "groups": {"stable": {"app": "acme.chat", "version": "v1", "local": True}},
            "local": {**self.local, "faults": faults},
        })  # fmt: skip

    async def post(self, prompt: str, key: str) -> int:
        from starlette.requests import Request

        async def receive() -> dict[str, Any]:
            body = json.dumps({"prompt": prompt, "max_tokens": 1}).encode()
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "",
                 "headers": [(b"authorization", f"Bearer {key}".encode())],
                 "query_string": b""}  # fmt: skip
        response = await self.router(Request(scope, receive))
        return int(response.status_code)

    def tenants(self) -> dict[str, Any]:
        return dict(self.router.local._kv_stats()["tenants"])

    def close(self) -> None:
        self.router.local.chaos.close()
        self.router.local.engine.stop()


def test_the_probe_identity_replays_through_the_router_and_finds_nothing(
    tmp_path: Path,
) -> None:
    """Its key runs the request as the synthetic tenant with its own salt: the tenant's
    repeat hits the cache, the identity's replay of the very same prompt finds nothing. Once
    the fault goes, the key is refused and the identity's cached blocks are given back."""
    from serving.dataplane.keys import hash_key

    local = _LocalRouter(tmp_path)
    now = time.time()
    probe = {"drill": "3", "issued_at": now, "expires_at": now + 60,
             "kv_pollution_probe": {"identity": "drill-probe:3",
                                    "key_hash": hash_key(local.PROBE_KEY),
                                    "quota_blocks": 8}}  # fmt: skip
    prompt = "a fresh prompt that spans more than one block of sixteen tokens, " * 2

    async def scenario() -> None:
        await local.configure({})
        assert await local.post(prompt, local.PROBE_KEY) == 401  # no fault: an unknown key
        await local.configure(probe)
        assert await local.post(prompt, local.KEY) == 200
        assert await local.post(prompt, local.KEY) == 200  # a repeat: hits its own blocks
        assert await local.post(prompt, local.PROBE_KEY) == 200  # the replay
        tenants = local.tenants()
        assert tenants["7"]["prefix_hits"] >= 16, tenants
        replay = tenants["drill-probe:3"]
        assert replay["prefix_queries"] > 0 and replay["prefix_hits"] == 0, replay
        assert replay["quota"] == 8 and replay["blocks_used"] > 0  # its blocks, cached
        cached = local.router.local._kv_stats()["cached_blocks"]
        await local.configure({})  # the revert
        assert await local.post(prompt, local.PROBE_KEY) == 401
        stats = local.router.local._kv_stats()
        assert "drill-probe:3" not in stats["tenants"]  # nothing of it is left behind
        # Its cached blocks went back to the free list; the tenant's stay cached.
        assert stats["cached_blocks"] == cached - replay["blocks_used"]
        assert stats["tenants"]["7"]["blocks_used"] == tenants["7"]["blocks_used"]
        assert local.router.local.engine.engine.pool.quotas == {}

    try:
        asyncio.run(scenario())
    finally:
        local.close()


def test_an_expired_probe_is_forgotten_by_the_replica_without_a_reconfigure(
    tmp_path: Path,
) -> None:
    from serving.dataplane.keys import hash_key

    local = _LocalRouter(tmp_path)
    now = time.time()
    probe = {"drill": "4", "issued_at": now, "expires_at": now + 60,
             "kv_pollution_probe": {"identity": "drill-probe:4",
                                    "key_hash": hash_key(local.PROBE_KEY)}}  # fmt: skip

    async def scenario() -> None:
        await local.configure(probe)
        assert await local.post("x " * 40, local.PROBE_KEY) == 200
        assert "drill-probe:4" in local.tenants()
        local.router.local.chaos.clock = lambda: now + 60  # the TTL has passed
        assert await local.post("x " * 40, local.PROBE_KEY) == 401
        local.router.local._published()  # the once-a-second publish tidies up
        assert "drill-probe:4" not in local.tenants()

    try:
        asyncio.run(scenario())
    finally:
        local.close()


def test_a_new_reload_nonce_hot_reloads_the_same_weights(tmp_path: Path) -> None:
    local = _LocalRouter(tmp_path)
    core_of = lambda: local.router.local  # noqa: E731

    def jitter(nonce: int, drill: str = "5", issued: float = T0) -> dict[str, Any]:
        return {"drill": drill, "issued_at": issued, "weight_swap_jitter": {"reload": nonce}}

    async def scenario() -> None:
        await local.configure({})
        assert len(core_of().reloads) == 1  # the first load
        model = core_of().engine.engine.model
        await local.configure(jitter(1))
        await local.configure(jitter(1))  # the same nonce again (another change): no reload
        await local.configure(jitter(2))
        assert await local.post("still serving", local.KEY) == 200
        await local.configure({})  # the revert reloads nothing
        await local.configure(jitter(1, drill="6", issued=T0 + 100))  # the next run's first
        reloads = core_of().reloads
        assert [(r.get("drill"), r.get("nonce"), r["ok"]) for r in reloads] == [
            (None, None, True), ("5", 1, True), ("5", 2, True), ("6", 1, True),
        ]  # fmt: skip
        assert core_of().engine.engine.model is not model  # swapped, same fingerprint
        assert core_of().loaded["fingerprint"] == "fp-1"
        published = core_of()._kv_stats()["fault_reload"]
        assert published["drill"] == "6" and published["nonce"] == 1 and published["ok"]

    try:
        asyncio.run(scenario())
    finally:
        local.close()
