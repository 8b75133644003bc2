"""End-to-end pages in headless Chromium (Playwright, sync API) against the live test server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Dialog, Page, Playwright, expect, sync_playwright

from tenants import services
from tenants.actors import Actor
from tenants.models import ApiToken, Membership, Role, Tenant
from tests.conftest import PASSWORD, make_world

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
TENANT_URL = re.compile(r"/t/([a-z0-9-]+)/$")  # plain group: Playwright matches it in JS


@pytest.fixture(scope="module", autouse=True)
def _allow_orm_beside_playwright() -> Iterator[None]:
    # Playwright's sync API keeps an asyncio loop running in this thread; Django would otherwise
    # refuse ORM calls from the test body ("You cannot call this from an async context"). Set for
    # this module only, so subprocesses started by other tests never inherit it.
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
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()  # fresh cookies and storage for every test
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


def _screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _slug_of(page: Page) -> str:
    match = TENANT_URL.search(page.url)
    assert match, f"not on a tenant page: {page.url}"
    return match[1]


def test_signup_then_create_and_revoke_token(live_server: Any, page: Page) -> None:
    email, organisation = "founder@initech.example", "Initech Labs"

    page.goto(f"{live_server.url}/accounts/signup/")
    form = page.get_by_test_id("signup-form")
    form.get_by_label("Email").fill(email)
    form.get_by_label("Password").fill(PASSWORD)
    form.get_by_label("Organisation name").fill(organisation)
    form.get_by_role("button", name="Sign up").click()

    expect(page).to_have_url(TENANT_URL)
    expect(page.get_by_test_id("tenant-heading")).to_have_text(organisation)
    slug = _slug_of(page)
    tenant = Tenant.objects.get(slug=slug)
    assert tenant.name == organisation
    assert Membership.objects.filter(tenant=tenant, user__email=email, role=Role.OWNER).exists()

    page.get_by_role("link", name="API tokens").click()
    tokens_url = f"{live_server.url}/t/{slug}/tokens/"
    expect(page).to_have_url(tokens_url)
    token_form = page.get_by_test_id("token-form")
    token_form.get_by_label("Name").fill("ci-deployer")
    token_form.get_by_label("Deploy").check()
    token_form.get_by_role("button", name="Create token").click()

    secret = page.get_by_test_id("token-secret")
    expect(secret).to_be_visible()
    raw = secret.inner_text().strip()
    assert len(raw) >= 20
    token = ApiToken.objects.get(tenant=tenant, name="ci-deployer")
    assert raw.startswith(token.prefix)
    assert set(token.scopes) >= {"read", "deploy"}
    assert token.revoked_at is None
    row = page.locator(f"#token-{token.pk}")
    expect(row.get_by_test_id("token-status")).to_have_text("active")

    # Load the page again (a GET: reloading the POST result would submit the form again).
    page.goto(tokens_url)
    expect(page.get_by_test_id("tokens-table")).to_contain_text("ci-deployer")
    expect(page.get_by_test_id("token-secret")).to_have_count(0)
    assert raw not in page.content()

    dialogs: list[str] = []

    def accept(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    row = page.locator(f"#token-{token.pk}")
    row.get_by_role("button", name="Revoke").click()
    expect(row.get_by_test_id("token-status")).to_have_text("revoked")
    expect(row.get_by_role("button", name="Revoke")).to_have_count(0)
    assert dialogs == ["Revoke ci-deployer?"]
    # htmx swapped the row in place: still the tokens page, no full navigation.
    assert page.url == tokens_url
    _screenshot(page, "token-revoked")

    token.refresh_from_db()
    assert token.revoked_at is not None
    assert token.status == "revoked"


def test_login_and_switch_between_two_tenants(live_server: Any, page: Page) -> None:
    world = make_world("Acme")
    other = services.tenant_create(
        owner=world.owner, name="Umbrella Research", actor=Actor(user=world.owner)
    )
    assert other.slug != world.tenant.slug

    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(world.owner.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()

    expect(page).to_have_url(TENANT_URL)
    first = Tenant.objects.get(slug=_slug_of(page))
    second = other if first == world.tenant else world.tenant
    assert first in (world.tenant, other)
    expect(page.get_by_test_id("tenant-heading")).to_have_text(first.name)

    switcher = page.locator("#tenant-switcher")
    expect(switcher).to_be_visible()
    expect(switcher.locator("option")).to_have_count(2)
    expect(switcher).to_have_value(first.slug)

    switcher.select_option(second.slug)  # onchange submits the form
    expect(page).to_have_url(f"{live_server.url}/t/{second.slug}/")
    expect(page.get_by_test_id("tenant-heading")).to_have_text(second.name)
    expect(page.locator("#tenant-switcher")).to_have_value(second.slug)
    _screenshot(page, "tenant-switched")

    # The choice sticks: the home page now sends the user to the tenant switched to.
    page.goto(f"{live_server.url}/")
    expect(page).to_have_url(f"{live_server.url}/t/{second.slug}/")
