"""Live ops pages in headless Chromium (Playwright, sync API): an incident's detail page and the
incident list follow the tenant's stream over a real WebSocket, the health page draws its
SLI charts with uPlot, and a drill made in its form runs live to its report (the run's steps,
a worker's part, are played by the test on a clock it moves).

Django's live_server is a WSGI server (no WebSockets) and daphne (channels' live server) is not
installed, so these tests serve the real ASGI app (`portal.asgi.application`: HTTP, static
files through WhiteNoise, Channels with the Redis layer) with uvicorn, as production does
(`portal/serve.py`), in a thread on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from incidents import drills, services
from incidents.drills.models import ChaosDrill, DrillRun, DrillStatus
from incidents.drills.tasks import advance_drill_run
from incidents.models import Incident
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health
from serving.ops.contracts import contract_set
from serving.telemetry.agent import AgentConfig, GpuAgent
from tenants.actors import Actor
from tests.conftest import PASSWORD, TenantWorld, make_world
from tests.incidents.factories import breach
from tests.incidents.slis import sample
from tests.serving.test_ops_loop import FAST_CONTRACT
from tests.serving.test_ops_pages import CONTRACT, publish_sli
from tests.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # WhiteNoise serves static files with a sync iterator; under ASGI Django warns (accepted in
    # docs/architecture.md, "Static files in ASGI"). The filter is global while a test runs,
    # so it covers the server's thread too.
    pytest.mark.filterwarnings(
        "ignore:StreamingHttpResponse must consume synchronous iterators:Warning"
    ),
]


@pytest.fixture(scope="module", autouse=True)
def _allow_orm_beside_playwright() -> Iterator[None]:
    # Playwright's sync API keeps an asyncio loop running in this thread (see test_browser.py);
    # scoped to this module so subprocesses started by other tests never inherit it.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is not installed: run .ci/ensure-services (make test does)")
    browser = playwright.chromium.launch(
        executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
    )
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture
def asgi_url(transactional_db: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The portal's ASGI app under uvicorn in a thread, on a free loopback port."""
    from portal.asgi import application

    # The server's worker threads end with the test: no persistent connections (the settings
    # dict is shared by every thread's connection), or they would be left open behind it.
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 0)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        application, lifespan="off", log_level="warning", ws="websockets-sansio"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def page(browser: Browser, asgi_url: str) -> Iterator[Page]:
    context = browser.new_context(base_url=asgi_url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()  # before the server stops: its sockets close cleanly


def _log_in(page: Page, world: TenantWorld) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(world.operator.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_test_id("tenant-heading")).to_be_visible()


def _in_another_thread(work: Any) -> None:
    """Run a service call as the web or a worker would: in its own thread (and connection).
    Not in the test's thread, where Playwright's loop runs and async_to_sync (the broadcast
    after commit) would refuse to work."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not errors, errors


def test_a_note_and_a_status_change_appear_live(page: Page, tmp_path: Path) -> None:
    world = make_world("Acme")
    incident = breach(world)[1]
    _log_in(page, world)
    page.goto(f"/t/{world.tenant.slug}/incidents/{incident.pk}/")
    live = page.get_by_test_id("incidents-live")
    expect(live).to_have_attribute("data-live", "open")  # the socket is connected
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    note = "Canary rolled back by hand; watching p95."

    _in_another_thread(lambda: services.incident_note(
        tenant=world.tenant, actor=Actor(user=world.owner), incident=incident, text=note,
    ))  # fmt: skip
    expect(page.get_by_test_id("timeline")).to_contain_text(note, timeout=5_000)
    assert page.evaluate("window.__sameDocument") is True
    expect(page.get_by_test_id("incident-status")).to_have_text("Triggered")
    page.screenshot(path=str(tmp_path / "incident-note-live.png"), full_page=True)

    # The list follows too: another user's acknowledgement changes the row in place.
    page.goto(f"/t/{world.tenant.slug}/incidents/")
    expect(page.get_by_test_id("incidents-live")).to_have_attribute("data-live", "open")
    page.evaluate("window.__sameDocument = true")
    _in_another_thread(lambda: services.incident_acknowledge(
        tenant=world.tenant, actor=Actor(user=world.owner), incident=incident,
    ))  # fmt: skip
    row = page.locator(f"#incident-{incident.pk}")
    expect(row.get_by_test_id("incident-status")).to_have_text("Acknowledged", timeout=5_000)
    # ...and a new incident, not shown yet, brings the table up to date.
    opened: list[int] = []
    _in_another_thread(lambda: opened.append(breach(world, group="canary")[1].pk))
    expect(page.locator(f"#incident-{opened[0]}")).to_be_visible(timeout=5_000)
    assert page.evaluate("window.__sameDocument") is True
    page.screenshot(path=str(tmp_path / "incident-list-live.png"), full_page=True)


def test_health_panel_follows_the_tick_and_charts_draw(page: Page, tmp_path: Path) -> None:
    world = make_world("Acme")
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    contract_set(tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment,
                 source=CONTRACT)  # fmt: skip
    now = timezone.now()
    for seconds in range(120, 0, -10):
        sample(deployment, now - timedelta(seconds=seconds), requests=50, errors=seconds % 3)
    _log_in(page, world)
    page.goto(f"/t/{world.tenant.slug}/deployments/{deployment.pk}/health/")
    expect(page.get_by_test_id("health-none")).to_be_visible()
    chart = page.get_by_test_id("sli-chart")
    expect(chart).to_have_attribute("data-points", "12")
    expect(chart.locator("canvas")).to_have_count(3)
    expect(chart.locator(".u-title")).to_have_text(
        ["Requests/s", "Error ratio", "p95 latency (ms)"]
    )

    def tick() -> None:  # what the beat's health task does every 2 s
        publish_sli(deployment, "stable", ok=95, failed=5)
        health.tick(now=time.time(), act=False)

    _in_another_thread(tick)
    row = page.locator('[data-testid="objective-row"][data-objective="availability"]')
    expect(row).to_have_attribute("data-state", "breach", timeout=5_000)  # htmx polled it
    expect(row.get_by_test_id("objective-value")).to_have_text("95%")
    page.screenshot(path=str(tmp_path / "health.png"), full_page=True)
    chart.get_by_role("button", name="7d").click()
    expect(chart).to_have_attribute("data-range", "7d")
    expect(chart.get_by_test_id("chart-empty")).to_be_visible()  # no minute rows yet


def test_the_gpu_dashboard_streams_samples_live(page: Page) -> None:
    """The dashboard's chart gets the tenant's GPU samples over /ws/gpu/ from the real agent
    (simulated provider: no GPU here), at least 10 in 3 s, marked simulated."""
    world = make_world("Acme")
    Deployment.objects.filter(tenant=world.tenant, name="assistant").update(
        status=DeploymentStatus.RUNNING
    )
    stop: list[Any] = []

    def agent_thread() -> None:  # the node's agent, as `manage.py gpu_agent --simulate` runs it
        from channels.layers import get_channel_layer

        async def run() -> None:
            import redis.asyncio as aioredis

            event = asyncio.Event()
            stop.append((asyncio.get_running_loop(), event))
            client = aioredis.Redis.from_url(settings.REDIS_URL)
            agent = GpuAgent(AgentConfig(node="node-a", hz=5, simulate=True),
                             layer=get_channel_layer(), redis_client=client)  # fmt: skip
            try:
                await agent.run(event)
            finally:
                await client.aclose()

        try:
            asyncio.run(run())
        finally:
            connection.close()

    thread = threading.Thread(target=agent_thread, daemon=True)
    thread.start()
    try:
        _log_in(page, world)
        page.goto(f"/t/{world.tenant.slug}/gpus/")
        live = page.get_by_test_id("gpu-live")
        if not page.get_by_test_id("gpu-simulated").count():  # the agent's first report
            page.wait_for_timeout(1_000)
            page.reload()
        expect(page.get_by_test_id("gpu-simulated")).to_contain_text("not real measurements")
        expect(page.get_by_test_id("gpu-card").first).to_be_visible(timeout=10_000)
        first = int(live.get_attribute("data-samples") or 0)
        page.wait_for_timeout(3_000)
        received = int(live.get_attribute("data-samples") or 0) - first
        assert received >= 10, f"{received} samples in 3 s"
        expect(page.get_by_test_id("gpu-simulated-badge").first).to_be_visible()
        expect(page.get_by_test_id("gpu-card").first.locator("canvas")).to_have_count(1)
        expect(page.get_by_test_id("gpu-kv")).to_contain_text("assistant")
        points = int(page.get_by_test_id("gpu-card").first.get_attribute("data-points") or 0)
        assert points >= 10
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "gpu-dashboard.png"), full_page=True)
        page.get_by_test_id("gpu-pause").click()
        expect(page.get_by_test_id("gpu-pause")).to_have_attribute("aria-pressed", "true")
    finally:
        if stop:
            loop, event = stop[0]
            loop.call_soon_threadsafe(event.set)
        thread.join(10)


DRILL_CONTRACT = FAST_CONTRACT.replace("action: rollback", "action: notify")  # no canary here


def test_a_drill_made_in_the_page_runs_live_to_its_report(
    page: Page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world("Acme")
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    contract_set(tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment,
                 source=DRILL_CONTRACT)  # fmt: skip
    monkeypatch.setattr(advance_drill_run, "delay", lambda *args, **kwargs: None)  # see above
    slug = world.tenant.slug
    t0 = time.time()

    def tick(at: float, ok: int, failed: int = 0) -> None:  # what the beat's health task does
        # While the fault bites, the replica reports it (a drill confirms it took effect).
        report = (
            {"drill": str(run.pk), "active": ["error_burst"], "effects_drill": str(run.pk),
             "effects": {"error_burst": failed}}
            if failed else None
        )  # fmt: skip
        publish_sli(deployment, "stable", ok=ok, failed=failed, faults=report)
        health.tick(now=at)

    _in_another_thread(lambda: tick(t0, ok=40))
    _log_in(page, world)

    # The catalogue, then a drill made in the form, with a schedule.
    page.goto(f"/t/{slug}/drills/")
    expect(page.get_by_test_id("drill-catalogue")).to_contain_text("replica_crash")
    page.get_by_test_id("drill-new").click()
    form = page.get_by_test_id("drill-form")
    form.locator('[name="name"]').fill("stable errors")
    form.locator('[name="deployment"]').select_option(str(deployment.pk))
    form.locator('[name="fault"]').select_option("error_burst")
    form.locator('[name="group"]').select_option("stable")
    # Only the chosen fault's parameters show, as fields with their range and default.
    expect(form.locator('[data-fault="latency_spike"]')).to_be_hidden()
    status_field = form.get_by_label("status")
    expect(status_field).to_have_value("503")
    expect(status_field).to_have_attribute("max", "599")
    status_field.fill("503")
    form.locator('[name="traffic_share"]').fill("0.5")
    form.locator('[name="duration_s"]').fill("10")
    form.get_by_label("The deployment's contract must hold").uncheck()
    form.locator('[name="probe_0_sli"]').select_option("error_rate")
    form.locator('[name="probe_0_bound"]').fill("0.05")
    form.locator('[name="abort_error_rate_above"]').fill("")
    form.locator('[name="schedule"]').fill("30 3 * * 1")
    form.get_by_role("button", name="Create drill").click()
    expect(page.get_by_test_id("drill-heading")).to_have_text("stable errors")
    drill = ChaosDrill.objects.get(tenant=world.tenant, name="stable errors")
    assert drill.schedule == "30 3 * * 1" and drill.parameters == {"status": 503}

    # Run now: the run page, scheduled until the worker takes its first step.
    page.get_by_test_id("drill-start").click()
    expect(page.get_by_test_id("run-heading")).to_contain_text("stable errors")
    run = DrillRun.objects.get(drill=drill)
    status = page.get_by_test_id("run-status")
    expect(status).to_have_attribute("data-status", DrillStatus.SCHEDULED)
    page.evaluate("window.__sameDocument = true")  # htmx swaps the fragment; no reload

    def step(at: float) -> None:
        _in_another_thread(lambda: drills.run_advance(run.pk, at))

    for offset in (0.1, 0.2, 0.3):  # start, check the steady state, inject
        step(t0 + offset)
    expect(status).to_have_attribute("data-status", DrillStatus.OBSERVING, timeout=5_000)
    timeline = page.get_by_test_id("run-timeline")
    expect(timeline.locator('li[data-kind="injected"]')).to_have_count(1)
    expect(page.get_by_test_id("run-stop")).to_be_visible()

    # The fault bites: half the requests fail, the contract's rule opens a drill incident.
    _in_another_thread(lambda: tick(t0 + 2, ok=20, failed=20))
    step(t0 + 2.1)
    expect(page.get_by_test_id("run-mttd")).to_contain_text("incident #", timeout=5_000)
    expect(timeline.locator('li[data-kind="deviated"]')).to_have_count(1)
    incident = Incident.objects.get(drill_run_id=run.pk)
    assert incident.is_drill

    # On-call mitigates; the fault's time runs out; the revert; the steady state is back.
    _in_another_thread(lambda: services.incident_mitigate(
        tenant=world.tenant, actor=Actor(user=world.owner), incident=incident, reason="drill",
    ))  # fmt: skip
    step(t0 + 4)
    expect(page.get_by_test_id("run-mttr")).to_contain_text(" s", timeout=5_000)
    _in_another_thread(lambda: tick(t0 + 11, ok=40))
    for offset in (11.1, 11.2):  # the duration is over: revert
        step(t0 + offset)
    expect(timeline.locator('li[data-kind="reverted"]')).to_have_count(1, timeout=5_000)
    _in_another_thread(lambda: tick(t0 + 30, ok=40))  # the 15 s window is clean again
    step(t0 + 30.1)
    expect(status).to_have_attribute("data-status", DrillStatus.PASSED, timeout=5_000)
    expect(status).to_contain_text("detected and recovered")
    expect(page.get_by_test_id("run-score")).to_contain_text("% of probe checks held")
    assert page.evaluate("window.__sameDocument") is True
    expect(page.get_by_test_id("run-stop")).to_have_count(0)  # nothing left to stop

    run.refresh_from_db()
    assert run.mttd_s is not None and run.mttr_s is not None and 0 < run.mttd_s <= run.mttr_s
    deployment.refresh_from_db()
    assert deployment.current_revision.faults == {}  # reverted
    chart = page.get_by_test_id("sli-chart")
    expect(chart.locator("canvas")).to_have_count(3)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "drill-run.png"), full_page=True)
