"""The request inspector in headless Chromium over the real ASGI app: the page meets the portal's
bars at both widths in light and dark (axe-core: no serious or critical violation, no sideways
page scroll), finds a trace from the search box, says what is wrong with a bad `q`, and shows a
new request without a reload (the 5 s poll)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from serving.dataplane.lifecycle import RecentRequests
from serving.deployments.models import Deployment
from tests.conftest import TenantWorld, make_world
from tests.telemetry.test_request_inspector import TRACE_A, _life, _publish, _two_replicas
from tests.test_browser_ops import (  # noqa: F401 (fixtures)
    _allow_orm_beside_playwright,
    _in_another_thread,
    _log_in,
    asgi_url,
    browser,
    page,
    playwright,
)
from tests.test_browser_pages import check_page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings(
        "ignore:StreamingHttpResponse must consume synchronous iterators:Warning"
    ),
]


@pytest.fixture
def published() -> Iterator[dict[str, Any]]:
    """Two router replicas publishing (every 2 s, as long as the test runs: their records
    expire after 10 s) once the test names the deployment; `extra` adds a third's requests."""
    state: dict[str, Any] = {"deployment": None, "extra": None}
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.5 if state["deployment"] is None else 2.0):
            deployment = state["deployment"]
            if deployment is not None:
                _two_replicas(deployment)
                if state["extra"] is not None:
                    _publish(deployment, "router-3", state["extra"])

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join(10)


def test_the_requests_page_meets_the_bars_searches_and_polls(
    page: Page,  # noqa: F811
    published: dict[str, Any],
) -> None:
    world: TenantWorld = make_world("Acme")
    deployment = Deployment.objects.select_related("tenant").get(
        tenant=world.tenant, name="assistant"
    )  # the publishing thread reads no database
    _in_another_thread(lambda: _two_replicas(deployment))
    published["deployment"] = deployment
    _log_in(page, world)
    url = f"/t/{world.tenant.slug}/deployments/{deployment.pk}/requests/"
    page.goto(url)
    recent = page.get_by_test_id("requests-recent")
    expect(recent.get_by_test_id("request-row")).to_have_count(5)
    bar = recent.locator(".lifecycle[role='img']").first
    expect(bar).to_have_attribute(
        "aria-label", "validating 5.00 ms, routing 5.00 ms, executing 40.00 ms"
    )
    problems = check_page(page, "request-inspector")
    page.emulate_media(color_scheme="dark")
    problems += check_page(page, "request-inspector-dark")
    page.emulate_media(color_scheme="light")
    assert problems == [], "\n".join(problems)

    page.get_by_label("Trace or request id").fill(TRACE_A)
    page.get_by_role("button", name="Find").click()
    found = page.get_by_test_id("requests-found")
    expect(found.get_by_test_id("request-row")).to_have_count(2)

    extra = RecentRequests()
    _life(extra, "from-router-3", started=time.time(), total_s=0.3, trace=TRACE_A)
    published["extra"] = extra
    # The poll keeps the search: the third replica's request of the trace shows, no reload.
    page.evaluate("window.__sameDocument = true")
    expect(found.get_by_test_id("request-row")).to_have_count(3, timeout=12_000)
    assert page.evaluate("window.__sameDocument") is True

    page.get_by_label("Trace or request id").fill("two words")
    page.get_by_role("button", name="Find").click()
    expect(page.get_by_test_id("requests-q-error")).to_contain_text("q must be a trace id")
    expect(page.get_by_label("Trace or request id")).to_have_attribute("aria-invalid", "true")
