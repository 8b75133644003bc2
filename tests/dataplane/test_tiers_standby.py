"""Degraded modes and fast recovery, their pure parts: the drift detector's σ, the tier policy's
hysteresis and compensation accounting, the router's tier choice, the standby copy and the
reload deadline in a version slot, and how tiers compile (the Ray tests drive them end to end:
tests/serving/test_tiers_ray.py)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from serving.control.compile import DeploymentSpec, SlotSpec, deployment_apps
from serving.dataplane.breaker import BreakerConfig, CircuitBreaker
from serving.dataplane.drift import DriftDetector, char_classes, length_bucket, normalized_kl
from serving.dataplane.guard import Refused
from serving.dataplane.standby import Standby, tensor_bytes
from serving.dataplane.tiers import FULL, TierConfig, TierPolicy, TierRouter
from serving.dataplane.version import VersionCore
from serving.engine.testing import write_tiny_checkpoint

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "cats",
    "sleep",
    "in",
    "warm",
    "sun",
]


def english(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() + "."


def drifted(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789#$%数据漂移") for _ in range(rng.randint(200, 400)))


def test_sigma_is_low_in_distribution_and_high_under_drift() -> None:
    rng = random.Random(1)
    detector = DriftDetector(reference=40, window=20)
    assert all(detector.observe(english(rng)) is None for _ in range(40))  # the reference
    sigmas = [detector.observe(english(rng)) for _ in range(40)]
    assert sigmas[:19] == [None] * 19  # until the window is full
    assert max(s for s in sigmas if s is not None) < 0.2
    for _ in range(20):
        sigma = detector.observe(drifted(rng))
    assert sigma is not None and sigma > 0.5
    assert detector.snapshot()["reference"] == 40


def test_features_and_divergence() -> None:
    assert length_bucket("") == 0 and length_bucket("x" * 10**6) == 12
    assert char_classes("aB3 .é") == [1, 1, 1, 1, 1, 1]
    assert normalized_kl([5, 5], [5, 5]) == pytest.approx(0.0)
    assert 0.9 < normalized_kl([100, 0], [0, 100]) < 1.0


def _config(**overrides: Any) -> TierConfig:
    raw = {
        "levels": [
            {"name": "proxy", "enter": 0.5, "exit": 0.4},
            {"name": "distilled", "enter": 0.2, "exit": 0.1},
        ],
        "dwell_s": 10,
        **overrides,
    }
    config = TierConfig.from_dict(raw)
    assert config is not None
    return config


def test_policy_enters_at_once_and_leaves_below_exit_after_the_dwell() -> None:
    policy = TierPolicy(_config(), now=0.0)
    assert [lv.name for lv in policy.config.levels] == ["distilled", "proxy"]  # by threshold
    assert policy.update(0.1, now=1) == FULL
    assert policy.update(0.3, now=2) == "distilled"
    assert policy.update(0.7, now=3) == "proxy"  # SelectModelBranch: σ >= 0.5
    assert policy.update(0.45, now=4) == "proxy"  # below enter, above exit: stays
    assert policy.update(0.3, now=5) == "proxy"  # below exit: the dwell starts
    assert policy.update(0.3, now=14) == "proxy"
    assert policy.update(0.45, now=14.5) == "proxy"  # back above exit: the dwell restarts
    assert policy.update(0.3, now=15) == "proxy"
    assert policy.update(0.3, now=25) == "distilled"  # 10 s calm: one step down
    assert policy.update(0.05, now=26) == "distilled"
    assert policy.update(0.05, now=36) == FULL
    reasons = [(t["from"], t["to"], t["reason"]) for t in policy.transitions]
    assert reasons == [
        (FULL, "distilled", "drift"),
        ("distilled", "proxy", "drift"),
        ("proxy", "distilled", "recovered"),
        ("distilled", FULL, "recovered"),
    ]
    # Degraded from t=2 to t=36; in the last 10 s (26..36) all of it.
    assert policy.degraded_s(100, now=40) == pytest.approx(34)
    assert policy.degraded_s(14, now=40) == pytest.approx(10)
    assert policy.degraded_s(3, now=40) == 0


def test_a_pinned_tier_holds_until_released() -> None:
    policy = TierPolicy(_config(pin="distilled"), now=0.0)
    assert policy.update(0.0, now=1) == "distilled"
    assert policy.update(0.9, now=2) == "distilled"  # σ does not move a pinned tier
    policy.config = _config(pin=None)
    assert policy.update(0.0, now=3) == FULL
    assert [t["reason"] for t in policy.transitions] == ["pinned", "released"]
    policy.config = _config(pin="full")
    assert policy.update(0.9, now=4) == FULL  # "full" pinned: no degrading at all


class FakeRouter:
    """The two things the tier router asks of the router (serving.dataplane.router.Router):
    its own choice (canary when asked, stable otherwise; or every breaker open) and breakers."""

    def __init__(self) -> None:
        self.breakers = {g: CircuitBreaker(BreakerConfig()) for g in ("stable", "distilled")}
        self.all_open = False

    def _route(self, requested: str | None) -> str:
        if self.all_open:
            raise Refused(503, "circuit_open", "the stable version's circuit breaker is open")
        return requested or "stable"

    def _breaker(self, group: str) -> CircuitBreaker:
        return self.breakers[group]


def _router(config: dict[str, Any]) -> tuple[TierRouter, FakeRouter]:
    fake = FakeRouter()
    router = TierRouter(fake)
    router.configure(config)
    return router, fake


def test_the_router_sends_stable_traffic_to_the_tier_in_force() -> None:
    rng = random.Random(2)
    raw = {
        "levels": [{"name": "distilled", "enter": 0.3, "exit": 0.2}],
        "reference_requests": 20,
        "window": 20,
        "dwell_s": 0,
    }
    router, _ = _router(raw)
    for _ in range(40):
        assert router.route(english(rng), None) == "stable"
    groups = [router.route(drifted(rng), None) for _ in range(20)]
    assert groups[-1] == "distilled"
    # A canary request stays on the canary; a drill's probe identity on the stable slot.
    assert router.route(drifted(rng), "canary") == "canary"
    assert router.route(drifted(rng), "stable", probe="probe-tenant") == "stable"
    for _ in range(20):
        last = router.route(english(rng), None)
    assert last == "stable"  # σ fell below exit, dwell 0: back to full
    snapshot = router.snapshot()
    assert snapshot is not None and snapshot["tier"] == FULL
    assert [t["to"] for t in snapshot["transitions"]] == ["distilled", FULL]
    router.configure(None)
    assert router.snapshot() is None


def test_both_breakers_open_send_the_request_down_a_tier() -> None:
    router, fake = _router({"levels": [{"name": "distilled", "enter": 0.2, "exit": 0.1}]})
    fake.all_open = True
    assert router.route("hi", None) == "distilled"
    assert router.breakers_open == 1
    # A level the router has no group for is never chosen.
    router.configure({"levels": [{"name": "proxy", "enter": 0.5, "exit": 0.4}]})
    with pytest.raises(Refused):
        router.route("hi", None)
    router.configure(
        {"levels": [{"name": "distilled", "enter": 0.2, "exit": 0.1}], "on_breakers_open": False}
    )
    with pytest.raises(Refused):
        router.route("hi", None)


def _slot(version: str, tmp: Path, seed: int) -> dict[str, Any]:
    directory = write_tiny_checkpoint(tmp / version, seed=seed)
    return {"version": version, "artifact": str(directory), "tenants": {"7": {"salt": "ab" * 32}}}


async def _answer(core: VersionCore) -> dict[str, Any]:
    request = {
        "request_id": f"r{time.monotonic_ns()}",
        "tenant": "7",
        "prompt": "Hello there",
        "sampling": {"max_tokens": 4, "temperature": 0, "top_p": 1.0},
    }
    return await core.complete(request)


def test_a_rollback_swaps_back_from_the_standby_copy_without_reading_the_disk(
    tmp_path: Path,
) -> None:
    v1, v2 = _slot("v1", tmp_path, 1), _slot("v2", tmp_path, 2)
    core = VersionCore(app="acme.chat", group="stable", engine={"num_blocks": 32})
    built: list[str] = []
    original = core._build_model

    def counted(config: dict[str, Any]) -> Any:
        built.append(config["version"])
        return original(config)

    core._build_model = counted  # type: ignore[method-assign]

    async def scenario() -> None:
        await core.reconfigure(v1)
        first = await _answer(core)
        await core.reconfigure(v2)
        assert (await _answer(core))["version"] == "v2"
        assert core.standby.snapshot()["version"] == "v1"
        await core.reconfigure(v1)  # the rollback
        again = await _answer(core)
        assert again["version"] == "v1" and again["text"] == first["text"]
        await core.reconfigure(v2)  # and forward again: v2 is the standby now
        assert (await _answer(core))["version"] == "v2"

    try:
        asyncio.run(scenario())
    finally:
        core.chaos.close()
        core.engine.stop()
    assert built == ["v1", "v2"]  # the artifact loader ran twice, for four loads
    published = core._kv_stats()["standby"]
    assert published["disk_loads"] == 2 and published["restores"] == 2
    assert published["bytes"] == tensor_bytes(core.standby.held[0]) > 0
    assert [r["from"] for r in core.reloads] == ["disk", "disk", "standby", "standby"]


def test_a_reload_that_overruns_its_deadline_fails_cleanly(tmp_path: Path) -> None:
    v1, v2 = _slot("v1", tmp_path, 1), _slot("v2", tmp_path, 2)
    core = VersionCore(app="acme.chat", group="stable", engine={"num_blocks": 32})
    original = core._build_model

    def slow(config: dict[str, Any]) -> Any:
        if config["version"] == "v2":
            time.sleep(0.5)  # a stalled read of the new weights
        return original(config)

    core._build_model = slow  # type: ignore[method-assign]

    async def scenario() -> None:
        await core.reconfigure({**v1, "reload_deadline_s": 0.2})
        await core.reconfigure({**v2, "reload_deadline_s": 0.2})
        assert (await _answer(core))["version"] == "v1"  # the old weights keep serving

    try:
        asyncio.run(scenario())
    finally:
        core.chaos.close()
        core.engine.stop()
    assert core.loaded["version"] == "v1"
    failed = core.reloads[-1]
    assert failed["ok"] is False and "deadline" in failed["error"]
    published = core._kv_stats()["standby"]
    assert published["deadline_failures"] == 1
    assert published["last_deadline_failure"]["version"] == "v2"
    assert "deadline" in published["last_failed_reload"]["error"]


def test_a_disabled_standby_keeps_nothing_and_the_first_load_has_no_deadline() -> None:
    standby = Standby(enabled=False)
    standby.keep(object(), None, None, {"artifact": "a"})
    assert standby.held is None and standby.snapshot()["bytes"] == 0

    async def first() -> Any:
        def slow(_: dict[str, Any]) -> str:
            time.sleep(0.05)
            return "built"

        return await Standby().build(slow, {"reload_deadline_s": 0.001}, hot=False)

    assert asyncio.run(first()) == "built"


def _spec(**overrides: Any) -> DeploymentSpec:
    slot = SlotSpec(version="m:v1", artifact="/a/v1", fingerprint="f1" * 16, arch_key="k")
    return DeploymentSpec(
        tenant_id="7", tenant_slug="acme", name="chat", revision=3, stable=slot, **overrides
    )


def test_tiers_compile_to_their_own_apps_and_router_groups() -> None:
    plain = deployment_apps(_spec(), {})
    assert [a["name"] for a in plain] == ["acme.chat"]
    assert "tiers" not in plain[0]["deployments"][0]["user_config"]
    assert "reload_deadline_s" not in plain[0]["deployments"][0]["user_config"]["local"]
    distilled = SlotSpec(version="m:small", artifact="/a/s", fingerprint="f2" * 16, arch_key="s")
    policy = {"levels": [{"name": "distilled", "enter": 0.2, "exit": 0.1}], "dwell_s": 5}
    apps = deployment_apps(
        _spec(tiers=(("distilled", distilled),), tier_policy=policy, reload_deadline_s=5.0), {}
    )
    assert [a["name"] for a in apps] == ["acme.chat", "acme.chat.distilled"]
    router = apps[0]["deployments"][0]["user_config"]
    assert router["groups"]["distilled"] == {"app": "acme.chat.distilled", "version": "m:small"}
    assert router["tiers"] == policy
    assert router["local"]["reload_deadline_s"] == 5.0
    tier = apps[1]["deployments"][0]["user_config"]
    assert tier["version"] == "m:small" and tier["reload_deadline_s"] == 5.0
    # A shared deployment runs on its pool alone: its tiers are not compiled.
    shared = replace(_spec(tiers=(("distilled", distilled),), tier_policy=policy), pool="p")
    assert [a["name"] for a in deployment_apps(shared, {})] == ["acme.chat"]


def _saturation_config(**overrides: Any) -> TierConfig:
    raw = {
        "levels": [{"name": "distilled", "enter": 0.3, "exit": 0.2}],
        "dwell_s": 10,
        "saturation": {"level": "distilled", "enter": 0.8, "exit": 0.5},
        **overrides,
    }
    config = TierConfig.from_dict(raw)
    assert config is not None
    return config


def test_saturation_enters_at_once_and_leaves_below_exit_after_the_dwell() -> None:
    policy = TierPolicy(_saturation_config(), now=0.0)
    assert policy.update(None, now=1, saturation=0.5) == FULL
    assert policy.update(None, now=2, saturation=0.9) == "distilled"
    assert policy.update(None, now=3, saturation=0.6) == "distilled"  # above exit: stays
    assert policy.update(None, now=4, saturation=0.3) == "distilled"  # the dwell starts
    assert policy.update(None, now=13, saturation=0.6) == "distilled"  # back above: restarts
    assert policy.update(None, now=14, saturation=0.3) == "distilled"
    assert policy.update(None, now=23.9, saturation=0.1) == "distilled"
    assert policy.update(None, now=24, saturation=0.1) == FULL
    assert [(t["to"], t["reason"]) for t in policy.transitions] == [
        ("distilled", "saturation"),
        (FULL, "recovered"),
    ]
    assert policy.transitions[0]["saturation"] == 0.9
    # σ and saturation together: the tier in force is the most degraded either asks for, and
    # it comes back only once both have calmed down.
    policy.update(0.5, now=30, saturation=0.9)
    assert policy.current == "distilled" and policy.transitions[-1]["reason"] == "drift"
    assert policy.update(0.1, now=41, saturation=0.9) == "distilled"  # σ calm, still loaded
    assert policy.update(0.1, now=42, saturation=0.1) == "distilled"
    assert policy.update(0.1, now=52, saturation=0.1) == FULL


def test_saturation_is_read_off_the_in_process_stable_slots_engine() -> None:
    class Engine:  # the engine's queues (serving.engine.engine.Engine)
        running: list[str] = []
        waiting: list[str] = []

    class Local:  # the router's in-process VersionCore, its AsyncEngine
        class engine:  # noqa: N801
            engine = Engine()

    fake = FakeRouter()
    fake.local = Local()  # type: ignore[attr-defined]
    router = TierRouter(fake, limit=lambda: 4)
    router.configure(
        {
            "levels": [{"name": "distilled", "enter": 0.3, "exit": 0.2}],
            "dwell_s": 0,
            "saturation": {"level": "distilled", "enter": 0.75, "exit": 0.5},
        }
    )
    assert router.route("hi", None) == "stable"
    Engine.running, Engine.waiting = ["a", "b"], ["c"]  # 3 of Serve's 4: saturated
    assert router.route("hi", None) == "distilled"
    snapshot = router.snapshot()
    assert snapshot is not None and snapshot["saturation"] == 0.75
    assert snapshot["reason"] == "saturation"
    Engine.running, Engine.waiting = ["a"], []
    assert router.route("hi", None) == "stable"  # dwell 0: back at once below exit
    # No limit known (outside a Serve replica) or no in-process slot: no saturation at all.
    assert TierRouter(fake, limit=lambda: None)._measure() is None
    assert TierRouter(FakeRouter(), limit=lambda: 4)._measure() is None


def test_a_float16_standby_copy_halves_the_memory_and_restores_the_engine_dtype(
    tmp_path: Path,
) -> None:
    import torch

    v1, v2 = _slot("v1", tmp_path, 1), _slot("v2", tmp_path, 2)
    half = {"standby_precision": "float16"}
    core = VersionCore(app="acme.chat", group="stable", engine={"num_blocks": 32})

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        await core.reconfigure({**v1, **half})
        first = await _answer(core)
        full_bytes = tensor_bytes(core.engine.engine.model)
        await core.reconfigure({**v2, **half})
        assert (await _answer(core))["version"] == "v2"
        held = core.standby.held[0]
        matrices = [held.embed, held.layers[0].qkv, held.layers[0].down]
        assert {m.dtype for m in matrices} == {torch.float16}
        assert held.layers[0].ln1.dtype == torch.float32  # vectors kept
        published = core.standby.snapshot()
        assert published["precision"] == "float16" and published["held_float16"] is True
        assert core.standby.bytes < 0.6 * full_bytes
        await core.reconfigure({**v1, **half})  # the rollback: from the float16 copy
        restored = core.engine.engine.model
        again = await _answer(core)
        return first, {"again": again, "restored": restored}

    try:
        first, out = asyncio.run(scenario())
    finally:
        core.chaos.close()
        core.engine.stop()
    restored = out["restored"]
    assert restored.dtype == torch.float32 and restored.embed.dtype == torch.float32
    assert restored.layers[0].gate_up.dtype == torch.float32
    assert out["again"]["version"] == "v1"
    assert core.standby.restores == 1 and core.standby.disk_loads == 2
    # The outgoing v2 is the standby now, in float16 again.
    assert core.standby.held_loaded["version"] == "v2" and core.standby.held_dtype is not None


def test_a_failed_hot_reload_is_kept_for_the_alert() -> None:
    standby = Standby()

    def broken(_: dict[str, Any]) -> Any:
        raise OSError("checkpoint unreadable")

    config = {"artifact": "/a/v2", "version": "m:v2", "reload_deadline_s": 5}
    with pytest.raises(OSError):
        asyncio.run(standby.build(broken, config, hot=True))
    with pytest.raises(OSError):  # a first load: the replica fails to start, not an alert
        asyncio.run(standby.build(broken, config, hot=False))
    published = standby.snapshot()["failures"]
    assert len(published) == 1
    assert published[0]["version"] == "m:v2" and "unreadable" in published[0]["error"]
    for n in range(10):
        with pytest.raises(OSError):
            asyncio.run(standby.build(broken, {**config, "version": f"m:{n}"}, hot=True))
    assert [f["version"] for f in standby.snapshot()["failures"]][-1] == "m:9"
    assert len(standby.snapshot()["failures"]) == 5  # bounded
