"""Shared fixtures: two tenants built through the services, API clients for tokens and sessions."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.conf import settings

from tests.support.worlds import (  # noqa: F401 (re-exported: tests import them from here)
    ALL_SCOPES,
    PASSWORD,
    TenantWorld,
    add_member,
    make_user,
    make_world,
    world_checkpoint,
)

_TEST_DOMAINS = (".example", ".example.com", ".example.net", ".example.org", ".test")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test on the session's Ray head is a `ray` test, marked or not: `make test` runs the
    tests without Ray on xdist workers (`-m "not ray"`), then the Ray tests in one process, so
    a Ray head never shares the two cores with other tests (its replicas then starve: canaries
    miss analyses, a second node's replica misses its SLI window; measured even with the other
    tests at nice 19, bench/README.md "The suite's time").

    An xdist worker does not run Ray tests: each worker would start a head of its own, and
    xdist's `--dist loadgroup` cannot keep them on one worker (xdist 3.8 renames the node id
    through `_nodeid`, which pytest 9 no longer reads). They are skipped there, with the
    command that runs them."""
    on_head = [
        item
        for item in items
        if "ray_cluster" in getattr(item, "fixturenames", ()) or item.get_closest_marker("ray")
    ]
    for item in on_head:
        if item.get_closest_marker("ray") is None:
            item.add_marker(pytest.mark.ray)
    if not hasattr(config, "workerinput"):  # not an xdist worker
        return
    skip = pytest.mark.skip(
        reason="Ray tests run in one process, not on xdist workers: "
        "pytest -m 'ray or vllm' (make test does)"
    )
    for item in on_head:
        item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A vLLM engine that dies (EngineDeadError) logged why in its own process, whose lines
    sit in the captured output that a CI excerpt cuts: the failure's one-line summary gets
    the engine processes' last error lines too."""
    outcome = yield
    report = outcome.get_result()
    crash = getattr(report.longrepr, "reprcrash", None)
    if not report.failed or crash is None or "EngineDeadError" not in crash.message:
        return
    from serving.engine.vllm.validate import ENGINE_REASON

    said = [
        line.strip()
        for _, text in report.sections
        for line in text.splitlines()
        if ENGINE_REASON.search(line)
    ]
    if said:
        crash.message += " | the engine's processes said: " + " / ".join(said[-4:])


@pytest.fixture(scope="session", autouse=True)
def _demo_models_trained_once(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every `demo_tenant` of the session (the `make up` smoke tests, the restart test: child
    processes, which inherit the variable) copies the demo's trained checkpoints after the
    first trains them (PORTAL_DEMO_MODEL_CACHE)."""
    import os

    with pytest.MonkeyPatch.context() as patch:
        if not os.environ.get("PORTAL_DEMO_MODEL_CACHE"):
            patch.setenv("PORTAL_DEMO_MODEL_CACHE", str(tmp_path_factory.mktemp("demo-models")))
        yield


@pytest.fixture(autouse=True)
def _webhook_hosts_resolve_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Webhook hosts of the tests (RFC 2606 names) resolve to 127.0.0.1 without asking DNS."""
    from portal import netguard

    real = netguard.resolve

    def resolve(host: str, port: int) -> list[str]:
        if f".{host.rstrip('.')}".endswith(_TEST_DOMAINS):
            return ["127.0.0.1"]
        return real(host, port)

    monkeypatch.setattr(netguard, "resolve", resolve)


@pytest.fixture(autouse=True)
def _clean_redis() -> Any:
    """Rate-limit buckets, cache entries and the ops loop's state (replicas' SLI values, the
    health tick's counters: keyed by deployment id, which a new test database hands out
    again) must not leak between tests (test Redis db only)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    for pattern in (
        f"{settings.RATE_LIMIT_KEY_PREFIX}:*",
        f"{settings.CACHES['default']['KEY_PREFIX']}:*",
        f"{settings.SLI_KEY_PREFIX}:*",
    ):
        keys = list(client.scan_iter(pattern))
        if keys:
            client.delete(*keys)
    from serving.ops.health import clear_caches

    clear_caches()  # what the health tick keeps in memory is keyed by ids too
    yield


@pytest.fixture
def world_a(db: Any) -> TenantWorld:
    return make_world("Acme")


@pytest.fixture
def world_b(db: Any) -> TenantWorld:
    return make_world("Globex")


# The session's one Ray head (tests marked `ray`, in any folder) and its per-test clean-up.
from tests.ray_cluster import _serve_apps_removed_after_ray_tests, ray_cluster  # noqa: E402, F401
