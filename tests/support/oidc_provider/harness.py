"""Drive the test provider from the portal's tests: start it as a subprocess on a free port,
set its users, and walk the authorization-code flow like a browser (httpx, posting the
provider's login and consent forms)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin

import httpx

ROOT = Path(__file__).resolve().parents[3]
PROVIDER_PASSWORD = "provider-password-1"  # noqa: S105 (a test user's, at the test provider)


@dataclass
class Provider:
    url: str
    client_id: str
    client_secret: str
    test_key: str
    log: Path

    @property
    def issuer(self) -> str:
        return f"{self.url}/o"

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def set_user(
        self,
        username: str,
        *,
        email: str,
        groups: list[str],
        password: str = PROVIDER_PASSWORD,
        email_verified: bool = True,
    ) -> None:
        response = httpx.post(
            f"{self.url}/test/users/",
            json={
                "username": username,
                "password": password,
                "email": email,
                "groups": groups,
                "email_verified": email_verified,
            },
            headers={"X-Test-Key": self.test_key},
            timeout=10,
        )
        response.raise_for_status()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def start_provider(*, redirect_uri: str, data_dir: Path) -> Iterator[Provider]:
    """The provider, migrated and serving; stopped (and its log closed) on exit."""
    port = _free_port()
    provider = Provider(
        url=f"http://127.0.0.1:{port}",
        client_id="portal-" + secrets.token_hex(4),
        client_secret=secrets.token_urlsafe(24),
        test_key=secrets.token_urlsafe(16),
        log=data_dir / "provider.log",
    )
    env = {**os.environ, "OP_TEST_KEY": provider.test_key, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [sys.executable, "-m", "tests.support.oidc_provider.serve", "--port", str(port)]
    # `--name=value`: a random secret may start with "-", which argparse would take for an option.
    command += [f"--data-dir={data_dir}", f"--client-id={provider.client_id}"]
    command += [f"--client-secret={provider.client_secret}", f"--redirect-uri={redirect_uri}"]
    with provider.log.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the provider exited: {provider.log.read_text()[-2000:]}")
            try:
                if httpx.get(provider.discovery_url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the provider did not start: {provider.log.read_text()[-2000:]}"
                )
            time.sleep(0.1)
        yield provider
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class _Forms(HTMLParser):
    """The POST forms of a page: action and the named inputs' values."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str, dict[str, str]]] = []
        self._open = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "form" and found.get("method", "get").lower() == "post":
            self.forms.append((found.get("action", ""), {}))
            self._open = True
        elif tag == "input" and self._open and found.get("name") and found.get("type") != "submit":
            self.forms[-1][1][found["name"]] = found.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._open = False


def post_form(client: httpx.Client, page: httpx.Response, **fields: str) -> httpx.Response:
    """Submit the page's first POST form with `fields` filled in (no redirects followed)."""
    parser = _Forms()
    parser.feed(page.text)
    assert parser.forms, f"no form on {page.url}: {page.text[:500]}"
    action, values = parser.forms[0]
    return client.post(urljoin(str(page.url), action), data={**values, **fields})


@dataclass
class Flow:
    client: httpx.Client
    callback: httpx.Response  # the portal's answer to the provider's redirect


def sign_in(
    client: httpx.Client,
    portal_url: str,
    username: str,
    *,
    password: str = PROVIDER_PASSWORD,
    authorize_url: Callable[[str], str] = lambda url: url,
    callback_url: Callable[[str], str] = lambda url: url,
) -> Flow:
    """One browser's (`client`, cookies and all) sign-in through the provider: the portal's redirect, the provider's
    login form, its consent form, and the redirect back to the portal's callback. The two
    hooks let a test tamper with the authorization request or the callback on the way."""
    start = client.get(f"{portal_url}/oidc/authenticate/")
    assert start.status_code == 302, (start.status_code, start.text[:300])
    login_page = client.get(authorize_url(start.headers["location"]), follow_redirects=True)
    consent = post_form(client, login_page, username=username, password=password)
    assert consent.status_code == 302, (consent.status_code, consent.text[:500])
    consent_page = client.get(urljoin(str(consent.url), consent.headers["location"]))
    back = post_form(client, consent_page, allow="Authorize")
    assert back.status_code == 302, (back.status_code, back.text[:500])
    callback = client.get(callback_url(back.headers["location"]))
    return Flow(client=client, callback=callback)


def signed_in_email(client: httpx.Client, portal_url: str) -> str | None:
    """Who the portal's session is signed in as (its account page), or None."""
    page = client.get(f"{portal_url}/accounts/security/")
    if page.status_code != 200:
        return None
    marker = '<span class="who">'
    return page.text.split(marker, 1)[1].split("<", 1)[0] if marker in page.text else None
