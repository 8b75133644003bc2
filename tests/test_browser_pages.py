"""Every page at product grade, in headless Chromium over the real ASGI app (issue 19, item 5):
at 1400 px and 390 px wide each page is screenshotted (test-artifacts/pages/), logs no console
error, keeps its top bar on one line and never scrolls sideways as a whole (wide tables scroll
inside their card), and axe-core (from npm) finds no serious or critical accessibility
violation. By keyboard alone: the first Tab reaches "Skip to content", which moves focus to
the page's content; on a narrow screen the menu opens from the keyboard and Escape closes it.
The home page shows a new incident without a reload (over the tenant's incident stream)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Browser, Page, expect

from incidents.models import Incident, IncidentStatus, Severity
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health
from serving.ops.contracts import contract_set
from tenants.actors import Actor
from tests.conftest import PASSWORD, TenantWorld, make_world
from tests.incidents.factories import breach
from tests.serving.test_ops_pages import CONTRACT, publish_sli
from tests.test_browser import ARTIFACTS
from tests.test_browser_ops import (  # noqa: F401 (fixtures)
    _allow_orm_beside_playwright,
    _in_another_thread,
    asgi_url,
    browser,
    playwright,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings(
        "ignore:StreamingHttpResponse must consume synchronous iterators:Warning"
    ),
]

AXE = Path(__file__).resolve().parent.parent / "node_modules" / "axe-core" / "axe.min.js"
WIDTHS = (1400, 390)
SHOTS = ARTIFACTS / "pages"
TOPBAR_MAX_PX = 64  # one line of the top bar; two would be about 90


def _pages(world: TenantWorld, incident: Incident) -> list[tuple[str, str]]:
    slug = world.tenant.slug
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    d = {"slug": slug, "pk": deployment.pk}
    model = world.version.model
    return [
        ("home", reverse("tenant-overview", args=[slug])),
        ("deployments", reverse("serving-deployments", args=[slug])),
        ("deployment", reverse("serving-deployment", kwargs=d)),
        ("health", reverse("serving-deployment-health", kwargs=d)),
        ("contract", reverse("serving-deployment-contract", kwargs=d)),
        ("rollouts", reverse("serving-deployment-rollouts", kwargs=d)),
        ("requests", reverse("serving-deployment-requests", kwargs=d)),
        ("compare", reverse("serving-deployment-compare", kwargs=d)),
        ("playground", reverse("serving-deployment-playground", kwargs=d)),
        ("breaker", reverse("serving-deployment-breaker", kwargs=d)),
        ("models", reverse("serving-models", args=[slug])),
        ("model", reverse("serving-model", kwargs={"slug": slug, "pk": model.pk})),
        ("gpus", reverse("serving-gpus", args=[slug])),
        ("pools", reverse("serving-pools", args=[slug])),
        ("alerts", reverse("alerts", args=[slug])),
        ("incidents", reverse("incident-list", args=[slug])),
        ("incident", reverse("incident-detail", kwargs={"slug": slug, "pk": incident.pk})),
        ("analytics", reverse("incident-analytics-page", args=[slug])),
        ("drills", reverse("drills", args=[slug])),
        ("drill-new", reverse("drill-new", args=[slug])),
        ("notifications", reverse("notification-channels", args=[slug])),
        ("cause-rules", reverse("cause-rules", args=[slug])),
        ("members", reverse("tenant-members", args=[slug])),
        ("tokens", reverse("tenant-tokens", args=[slug])),
        ("audit", reverse("tenant-audit", args=[slug])),
        ("settings", reverse("tenant-settings", args=[slug])),
        ("account", reverse("account-security")),
        ("password", reverse("password_change")),
        ("platform", reverse("platform-status")),  # the owner is staff in this test
        ("pool-new", reverse("platform-pool-new")),
    ]


@pytest.fixture
def world(transactional_db: Any) -> TenantWorld:
    world = make_world("Acme")
    Deployment.objects.filter(tenant=world.tenant).update(status=DeploymentStatus.RUNNING)
    return world


def _incident(world: TenantWorld, title: str) -> Incident:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    return Incident.objects.create(
        tenant=world.tenant, deployment=deployment, title=title, severity=Severity.PAGE,
        status=IncidentStatus.TRIGGERED, dedup_key=f"k-{title}",
    )  # fmt: skip


@pytest.fixture
def owner_page(browser: Browser, asgi_url: str, world: TenantWorld) -> Iterator[Page]:  # noqa: F811
    context = browser.new_context(base_url=asgi_url, viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto("/accounts/login/")
    check_page(page, "login", anonymous=True)
    page.get_by_label("Username").fill(world.owner.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_test_id("tenant-heading")).to_be_visible()
    try:
        yield page
    finally:
        context.close()


def _axe(page: Page) -> list[dict[str, Any]]:
    page.add_script_tag(path=str(AXE))
    result = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))"
    )
    return [v for v in result if v["impact"] in ("serious", "critical")]


def check_page(page: Page, name: str, *, anonymous: bool = False) -> list[str]:
    """The quality bars of the page now open, at each width; the problems found."""
    problems: list[str] = []
    SHOTS.mkdir(parents=True, exist_ok=True)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_load_state("networkidle")
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
        box = page.locator("header.topbar").bounding_box()
        if box is None or box["height"] > TOPBAR_MAX_PX:
            problems.append(f"{name} @{width}: top bar {box and box['height']} px high")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        if overflow > 1:
            problems.append(f"{name} @{width}: the page scrolls sideways by {overflow} px")
        problems.extend(
            f"{name} @{width}: axe {v['impact']} {v['id']} ({v['help']}) {v['nodes']}"
            for v in _axe(page)
        )
    page.set_viewport_size({"width": 1400, "height": 900})
    return problems


def test_every_page_meets_the_bars_at_both_widths(owner_page: Page, world: TenantWorld) -> None:
    page = owner_page
    errors: list[str] = []
    page.on(
        "console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None
    )
    page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
    incident = _incident(world, "latency up")
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    world.owner.is_staff = True  # the platform page too, and the staff's side navigation
    world.owner.save(update_fields=["is_staff"])

    def traffic() -> None:  # a contract and two real health ticks: the pages have numbers
        contract_set(tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment,
                     source=CONTRACT)  # fmt: skip
        for ok, failed in ((900, 4), (1900, 12)):
            publish_sli(deployment, "stable", ok=ok, failed=failed)
            health.tick(now=time.time(), act=False)
            time.sleep(1.1)

    _in_another_thread(traffic)
    problems: list[str] = []
    for name, url in _pages(world, incident):
        response = page.goto(url)
        assert response is not None and response.status == 200, (name, url)
        problems += check_page(page, name)
    assert not problems, "\n".join(problems)
    assert not errors, "\n".join(errors)
    assert len(list(SHOTS.glob("*.png"))) >= 2 * 25


def test_keyboard_alone_skips_to_content_and_works_the_narrow_menu(
    owner_page: Page, world: TenantWorld
) -> None:
    page = owner_page
    page.goto(reverse("serving-deployments", args=[world.tenant.slug]))
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to content")
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    page.set_viewport_size({"width": 390, "height": 800})
    expect(page.get_by_test_id("sidebar")).to_be_hidden()
    toggle = page.get_by_role("button", name="Menu")
    toggle.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("sidebar")).to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    focused = page.evaluate("document.activeElement.textContent")
    assert focused == "Overview"  # the menu's first link
    expect(page.get_by_role("link", name="Deployments")).to_have_attribute("aria-current", "page")
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("sidebar")).to_be_hidden()
    assert page.evaluate("document.activeElement.dataset.menuToggle") == ""
    # The theme button cycles system -> light -> dark, and the choice outlives the page.
    theme = page.locator("[data-theme-toggle]")
    theme.focus()
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    page.reload()
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    background = "getComputedStyle(document.body).backgroundColor"
    assert page.evaluate(background) == "rgb(13, 17, 23)"  # the dark tokens apply
    check_page(page, "deployments-dark")


SCROLLERS_WITHOUT_STOP = """() => [...document.querySelectorAll('table.list')]
  .filter(t => t.scrollWidth > t.clientWidth + 1 && t.getAttribute('tabindex') !== '0')
  .map(t => t.dataset.testid)"""


def test_a_table_that_starts_to_scroll_has_its_tab_stop_before_anything_else_runs(
    owner_page: Page, world: TenantWorld
) -> None:
    """A narrowed window (in the frame's resize steps) and a live swap (in the swap's own
    microtask) give a sideways-scrolling table its tab stop at once: a deferred pass let axe
    (and a keyboard user) meet a scrolling table with none, between the swap and its settle."""
    page = owner_page
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")

    def traffic() -> None:
        contract_set(tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment,
                     source=CONTRACT)  # fmt: skip
        publish_sli(deployment, "stable", ok=900, failed=4)
        health.tick(now=time.time(), act=False)

    _in_another_thread(traffic)
    page.goto(reverse("serving-deployment-health", args=[world.tenant.slug, deployment.pk]))
    expect(page.get_by_test_id("objectives")).to_be_visible()
    page.set_viewport_size({"width": 390, "height": 800})
    # The next frame: its resize steps have run, a deferred pass has not.
    missing = page.evaluate(
        f"() => new Promise(r => requestAnimationFrame(() => r(({SCROLLERS_WITHOUT_STOP})())))"
    )
    assert missing == []
    assert page.evaluate("document.querySelector('[data-testid=objectives]').tabIndex") == 0
    # The server's next panel, swapped in as htmx does, checked before htmx's settle event:
    # after one microtask.
    missing = page.evaluate(
        "async () => { const live = document.querySelector('#health-live');"
        " const html = await (await fetch(live.getAttribute('hx-get'),"
        " {headers: {'HX-Request': 'true'}})).text();"
        " live.outerHTML = html; await null;"
        " if (!document.querySelector('#health-live [data-testid=objectives]')) return 'no table';"
        f" return ({SCROLLERS_WITHOUT_STOP})(); }}"
    )
    assert missing == []


def test_a_new_incident_shows_on_the_home_page_without_a_reload(
    owner_page: Page, world: TenantWorld
) -> None:
    page = owner_page
    page.goto(reverse("tenant-overview", args=[world.tenant.slug]))
    expect(page.locator("[data-incidents-live]")).to_have_attribute("data-live", "open")
    expect(page.get_by_test_id("tile-incidents")).to_have_text("0")
    marker = page.evaluate("window.__marker = Math.random()")
    # The panel without its 5 s poll (a copy htmx never processed): only the incident stream
    # can bring it up to date now.
    page.evaluate("() => { const g = document.querySelector('#glance');"
                  " g.replaceWith(g.cloneNode(true)); }")  # fmt: skip
    opened: list[Incident] = []
    started = time.monotonic()
    _in_another_thread(lambda: opened.append(breach(world)[1]))
    expect(page.get_by_test_id("tile-incidents")).to_have_text("1", timeout=10_000)
    shown_s = time.monotonic() - started
    expect(page.get_by_test_id("glance-open-incidents")).to_contain_text(opened[0].title)
    assert page.evaluate("window.__marker") == marker  # the same page: no reload
    print(f"incident opened -> on the home page: {shown_s * 1000:.0f} ms")


def test_the_contract_editor_marks_a_bad_line_as_you_type_and_saves(
    owner_page: Page, world: TenantWorld
) -> None:
    """CodeMirror highlights the YAML, marks a bad line and lists the problem while the user
    types (the portal's own check), a problem's button moves the cursor to its line, and the
    form saves what the editor holds."""
    page = owner_page
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    page.goto(reverse("serving-deployment-contract", args=[world.tenant.slug, deployment.pk]))
    editor = page.locator(".CodeMirror")
    expect(editor).to_be_visible()
    expect(page.locator(".cm-atom, .cm-string, .cm-keyword").first).to_be_visible()  # highlighted
    expect(page.get_by_test_id("contract-status")).to_have_text("The contract is valid.")
    page.evaluate(
        "src => document.querySelector('.CodeMirror').CodeMirror.setValue(src)",
        CONTRACT.replace("target: 0.99", "target: 7"),
    )
    expect(page.get_by_test_id("contract-status")).to_have_text("1 problem in the contract")
    problems = page.get_by_test_id("contract-problems")
    expect(problems).to_contain_text("line 10 — spec.objectives[0].target")
    expect(page.locator(".CodeMirror-lint-marker-error")).to_have_count(1)
    problems.get_by_role("button").click()
    assert page.evaluate("document.querySelector('.CodeMirror').CodeMirror.getCursor().line") == 9
    page.evaluate("src => document.querySelector('.CodeMirror').CodeMirror.setValue(src)", CONTRACT)
    expect(page.get_by_test_id("contract-status")).to_have_text("The contract is valid.")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_test_id("contract-current")).to_have_text("chat-sla v1")


def test_the_deploy_form_shows_its_cost_as_it_is_filled_and_still_deploys(
    owner_page: Page, world: TenantWorld
) -> None:
    page = owner_page
    page.goto(reverse("serving-deployments", args=[world.tenant.slug]))
    cost = page.get_by_test_id("deploy-cost")
    expect(cost.get_by_test_id("cost-table")).to_be_visible()  # worked out on load
    form = page.get_by_test_id("deployment-form")
    form.get_by_label("Replicas:", exact=True).fill("4")
    expect(cost.locator('[data-resource="replicas"]')).to_have_attribute("data-over", "true")
    expect(cost.get_by_test_id("cost-refused")).to_be_visible()
    form.get_by_label("Replicas:", exact=True).fill("1")
    expect(cost.get_by_test_id("cost-refused")).to_be_hidden()
    form.get_by_label("Name:", exact=True).fill("second")
    form.get_by_role("button", name="Deploy").click()
    expect(page.get_by_test_id("deployments-table")).to_contain_text("second")
    assert Deployment.objects.filter(tenant=world.tenant, name="second").exists()
