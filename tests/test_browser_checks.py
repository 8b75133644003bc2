"""A version check in headless Chromium: an operator starts a benchmark from the version page,
the check page polls (htmx) while it is queued, turns to the result in place when the worker
(played by the test) finishes it, and "Copy" puts the drafted contract on the clipboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from serving.deployments.models import Deployment
from serving.ops.checks.models import VersionCheck
from serving.ops.checks.services import version_check_run
from serving.ops.checks.tasks import run_version_check
from tests.conftest import make_world
from tests.test_browser_ops import (  # noqa: F401 (fixtures)
    _allow_orm_beside_playwright,
    _in_another_thread,
    _log_in,
    asgi_url,
    browser,
    page,
    playwright,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings(
        "ignore:StreamingHttpResponse must consume synchronous iterators:Warning"
    ),
]


def test_a_benchmark_started_on_the_page_turns_live_into_its_table_and_draft(
    page: Page,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world("Acme")
    version = Deployment.objects.get(
        tenant=world.tenant, name="assistant"
    ).current_revision.stable_version
    queued: list[int] = []
    # The worker's part is played below, so the page sees the check queued first.
    monkeypatch.setattr(run_version_check, "delay", queued.append)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    _log_in(page, world)
    page.goto(f"/t/{world.tenant.slug}/models/{version.model_id}/")
    page.get_by_test_id("version-link").first.click()
    expect(page.get_by_test_id("version-heading")).to_have_text(f"served {version.label}")
    expect(page.get_by_test_id("golden-row")).to_have_count(4)

    form = page.get_by_test_id("benchmark-form")
    form.get_by_label("Concurrencies").fill("1, 2")
    form.get_by_label("Requests").fill("3")
    form.get_by_label("Max tokens").fill("3")
    form.get_by_role("button", name="Benchmark").click()
    expect(page.get_by_test_id("check-live")).to_have_attribute("data-status", "queued")
    check = VersionCheck.objects.get(version=version)
    assert queued == [check.pk]
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    _in_another_thread(lambda: version_check_run(check_id=check.pk))
    live = page.get_by_test_id("check-live")
    expect(live).to_have_attribute("data-status", "done", timeout=6_000)
    assert page.evaluate("window.__sameDocument") is True
    expect(page.get_by_test_id("level-row")).to_have_count(2)
    page.get_by_test_id("draft-copy").click()
    expect(page.get_by_test_id("draft-copy")).to_have_text("Copied")
    copied: Any = page.evaluate("navigator.clipboard.readText()")
    check.refresh_from_db()
    assert copied == check.draft and "p95-ttft" in copied
    expect(page.get_by_test_id("contract-editor-link")).to_have_text("Contract editor of assistant")
    page.screenshot(path=str(tmp_path / "version-check.png"), full_page=True)
