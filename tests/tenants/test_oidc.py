"""Single sign-on against a real OpenID Connect provider: django-oauth-toolkit in OIDC mode,
its own Django project in a subprocess (tests/support/oidc_provider), and the portal under
live_server. The flow is a browser's: the portal's redirect, the provider's login and consent
forms, the callback. Then the refusals (a forged state, a nonce that is not the session's, a
token signed by another key, an unverified e-mail) and the group -> membership reconcile."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import jwt
import pyotp
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.test import Client

from portal import settings as portal_settings
from portal.exceptions import PermissionDeniedError, ValidationFailed
from tenants import oidc, services
from tenants.actors import Actor
from tenants.mfa import services as mfa
from tenants.models import AuditEvent, Membership, MembershipSource, Role, Tenant
from tests.conftest import PASSWORD, add_member, make_user
from tests.support.oidc_provider.harness import Provider, sign_in, signed_in_email, start_provider


@pytest.fixture(scope="module")
def provider(live_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    data_dir = tmp_path_factory.mktemp("oidc-provider")
    with start_provider(redirect_uri=f"{live_server.url}/oidc/callback/", data_dir=data_dir) as op:
        yield op


@pytest.fixture
def browser() -> Iterator[Callable[[], httpx.Client]]:
    """A new browser (an httpx client with its own cookies) per call; all closed after."""
    clients: list[httpx.Client] = []

    def new() -> httpx.Client:
        clients.append(httpx.Client(timeout=30))
        return clients[-1]

    yield new
    for client in clients:
        client.close()


def _tenant(name: str) -> Tenant:
    owner = make_user(f"owner@{name.lower()}.example")
    return services.tenant_create(owner=owner, name=name, actor=Actor(user=owner))


def _configure(settings: Any, provider: Provider, group_roles: dict[str, dict[str, str]]) -> None:
    settings.OIDC_ENABLED = True
    settings.OIDC_PROVIDER_NAME = "Test IdP"
    settings.OIDC_RP_CLIENT_ID = provider.client_id
    settings.OIDC_RP_CLIENT_SECRET = provider.client_secret
    settings.OIDC_OP_DISCOVERY_URL = provider.discovery_url
    settings.OIDC_RP_SCOPES = "openid email profile groups"
    settings.OIDC_GROUP_ROLES = group_roles
    settings.AUTHENTICATION_BACKENDS = [
        "django.contrib.auth.backends.ModelBackend",
        "tenants.oidc.Backend",
    ]
    oidc.forget_discovery()


@pytest.fixture
def tenants(transactional_db: Any) -> dict[str, Tenant]:
    return {name: _tenant(name) for name in ("Acme", "Globex", "Initech")}


@pytest.fixture
def sso(settings: Any, provider: Provider, tenants: dict[str, Tenant]) -> Iterator[Provider]:
    acme, globex, initech = (tenants[n].slug for n in ("Acme", "Globex", "Initech"))
    _configure(
        settings,
        provider,
        {
            "acme-devs": {"tenant": acme, "role": "operator"},
            "acme-leads": {"tenant": acme, "role": "owner"},
            "globex-readers": {"tenant": globex, "role": "viewer"},
            "initech-ops": {"tenant": initech, "role": "operator"},
            "hostile": {"tenant": "no-such-tenant", "role": "owner"},
        },
    )
    yield provider
    oidc.forget_discovery()


def _memberships(email: str) -> dict[str, tuple[str, str]]:
    return {
        m.tenant.name: (m.role, m.source)
        for m in Membership.objects.filter(user__email=email).select_related("tenant")
    }


def _login_page_text(flow: Any, portal_url: str) -> str:
    return flow.client.get(f"{portal_url}/accounts/login/").text


def test_sign_in_through_the_provider_grants_the_mapped_memberships(
    browser: Any,
    sso: Provider,
    live_server: Any,
    tenants: dict[str, Tenant],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sso.set_user(
        "ada", email="Ada@Corp.example", groups=["acme-devs", "globex-readers", "hostile", "x"]
    )
    seen: dict[str, str] = {}

    def authorize(url: str) -> str:
        seen.update({k: v[0] for k, v in parse_qs(urlsplit(url).query).items()})
        return url

    with caplog.at_level(logging.WARNING, logger="tenants.services.sso"):
        flow = sign_in(browser(), live_server.url, "ada", authorize_url=authorize)

    # The authorization request carried a state, a nonce and a PKCE S256 challenge.
    assert seen["state"] and seen["nonce"] and seen["code_challenge"]
    assert seen["code_challenge_method"] == "S256"
    assert seen["scope"] == "openid email profile groups"
    assert flow.callback.status_code == 302
    assert flow.callback.headers["location"] == "/"
    assert signed_in_email(flow.client, live_server.url) == "ada@corp.example"

    user = User.objects.get(email="ada@corp.example")
    assert user.username == "ada@corp.example" and not user.has_usable_password()
    assert not user.is_staff and not user.is_superuser
    assert _memberships("ada@corp.example") == {
        "Acme": ("operator", MembershipSource.OIDC),
        "Globex": ("viewer", MembershipSource.OIDC),
    }
    # The hostile group names a tenant that does not exist: logged, nothing created.
    assert not Tenant.objects.filter(slug="no-such-tenant").exists()
    assert any("no-such-tenant" in r.getMessage() for r in caplog.records)
    created = AuditEvent.objects.filter(action="membership.created", actor_label="system:oidc")
    assert created.count() == 2
    assert created.get(tenant=tenants["Acme"]).after["groups"] == ["acme-devs"]


def test_the_next_sign_in_reconciles_memberships_and_leaves_local_ones(
    browser: Any, sso: Provider, live_server: Any, tenants: dict[str, Tenant]
) -> None:
    # Grace is a member of Initech by invitation: her groups never touch that membership.
    grace = add_member(
        tenants["Initech"], _owner(tenants["Initech"]), "grace@corp.example", "viewer"
    )
    sso.set_user("grace", email="grace@corp.example", groups=["acme-devs", "globex-readers"])
    assert signed_in_email(sign_in(browser(), live_server.url, "grace").client, live_server.url)
    assert _memberships(grace.email) == {
        "Acme": ("operator", "oidc"),
        "Globex": ("viewer", "oidc"),
        "Initech": ("viewer", "local"),
    }

    # Promoted at Acme (two groups: the higher role wins), out of Globex, into Initech's ops.
    sso.set_user(
        "grace", email="grace@corp.example", groups=["acme-devs", "acme-leads", "initech-ops"]
    )
    flow = sign_in(browser(), live_server.url, "grace")
    assert signed_in_email(flow.client, live_server.url) == grace.email
    assert _memberships(grace.email) == {
        "Acme": ("owner", "oidc"),
        "Initech": ("viewer", "local"),
    }
    actions = set(
        AuditEvent.objects.filter(actor_label="system:oidc").values_list("action", flat=True)
    )
    assert {"membership.created", "membership.role_changed", "membership.removed"} <= actions

    # No mapped group left: every membership the provider granted goes; the local one stays.
    sso.set_user("grace", email="grace@corp.example", groups=[])
    assert signed_in_email(sign_in(browser(), live_server.url, "grace").client, live_server.url)
    assert _memberships(grace.email) == {"Initech": ("viewer", "local")}


def _owner(tenant: Tenant) -> User:
    return Membership.objects.get(tenant=tenant, role=Role.OWNER).user


def test_a_password_account_with_two_factor_signs_in_through_the_provider_without_a_code(
    browser: Any, sso: Provider, live_server: Any, tenants: dict[str, Tenant]
) -> None:
    """The provider does MFA; the account keeps its password (and its code for passwords)."""
    user = make_user("lin@corp.example")
    mfa.totp_enrolment_start(user=user)
    device = user.totp_device
    mfa.totp_enrolment_confirm(user=user, code=pyotp.TOTP(device.secret).now())
    sso.set_user("lin", email="LIN@corp.example", groups=["globex-readers"])
    flow = sign_in(browser(), live_server.url, "lin")
    assert signed_in_email(flow.client, live_server.url) == "lin@corp.example"
    assert User.objects.filter(email__iexact="lin@corp.example").count() == 1
    user.refresh_from_db()
    assert user.check_password(PASSWORD)
    assert _memberships(user.email) == {"Globex": ("viewer", "oidc")}


def _replace_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    return urlunsplit(parts._replace(query=urlencode({**query, **changes})))


@pytest.mark.parametrize("attack", ["state", "nonce", "signing-key", "unverified-email"])
def test_refused_sign_ins_sign_nobody_in(
    browser: Any, attack: str, sso: Provider, live_server: Any, settings: Any
) -> None:
    sso.set_user(
        f"eve-{attack}",
        email=f"eve-{attack}@corp.example",
        groups=["acme-leads"],
        email_verified=attack != "unverified-email",
    )
    hooks: dict[str, Any] = {}
    if attack == "state":  # a callback for a flow this browser never started
        hooks["callback_url"] = lambda url: _replace_query(url, state="forged-state")
    elif attack == "nonce":  # an ID token minted for another nonce than the session's
        hooks["authorize_url"] = lambda url: _replace_query(url, nonce="attacker-nonce")
    elif attack == "signing-key":  # the portal's JWKS holds another key under the same kid
        settings.OIDC_OP_JWKS_ENDPOINT = f"{sso.url}/test/other-jwks/"

    flow = sign_in(browser(), live_server.url, f"eve-{attack}", **hooks)

    assert flow.callback.status_code == 302
    assert flow.callback.headers["location"] == "/accounts/login/"
    assert signed_in_email(flow.client, live_server.url) is None
    assert not Membership.objects.filter(user__email=f"eve-{attack}@corp.example").exists()
    page = _login_page_text(flow, live_server.url)
    expected = {
        "state": "state not found",
        "nonce": "Nonce verification failed",
        "signing-key": "JWS token verification failed",
        "unverified-email": "has not verified the e-mail address",
    }[attack]
    assert expected in page, page


# --- Without the provider: the login page, the settings check, the reconcile's rules --------


def test_the_login_page_offers_sso_only_when_configured(settings: Any, db: Any) -> None:
    client = Client()
    assert "oidc-login" not in client.get("/accounts/login/").content.decode()
    assert client.get("/oidc/authenticate/").status_code == 404
    settings.OIDC_ENABLED = True
    settings.OIDC_PROVIDER_NAME = "Okta"
    page = client.get("/accounts/login/?next=/t/x/").content.decode()
    assert re.search(r'href="/oidc/authenticate/\?next=/t/x/"[^>]*>Sign in with Okta<', page)


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ('{"eng": {"tenant": "acme", "role": "admin"}}', "OIDC_GROUP_ROLES['eng'].role"),
        ('{"eng": {"tenant": "Acme Inc", "role": "viewer"}}', "OIDC_GROUP_ROLES['eng'].tenant"),
        ('{"eng": {"tenant": "acme"}}', "OIDC_GROUP_ROLES['eng']"),
        ('["eng"]', "OIDC_GROUP_ROLES must be a JSON object"),
        ("{eng", "OIDC_GROUP_ROLES is not valid JSON"),
    ],
)
def test_group_roles_are_checked_at_startup_naming_the_key(raw: str, named: str) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        portal_settings.oidc_group_roles(raw)
    assert named in str(info.value)


def test_the_settings_know_every_role() -> None:
    assert set(portal_settings.OIDC_ROLE_NAMES) == set(Role.values)
    good = '{"eng": {"tenant": "acme-1", "role": "operator"}}'
    assert portal_settings.oidc_group_roles(good) == {
        "eng": {"tenant": "acme-1", "role": "operator"}
    }


@pytest.fixture
def mapped(settings: Any, db: Any) -> Tenant:
    tenant = _tenant("Umbrella")
    settings.OIDC_GROUP_ROLES = {
        "leads": {"tenant": tenant.slug, "role": "owner"},
        "devs": {"tenant": tenant.slug, "role": "operator"},
        "ghost": {"tenant": "ghost-tenant", "role": "owner"},
    }
    return tenant


def test_the_last_owner_of_a_tenant_is_kept_when_their_group_goes(mapped: Tenant) -> None:
    """A tenant never loses its last owner to a group change: refused, kept, audited. The
    founding owner (a local membership) is never touched by groups at all."""
    founder = _owner(mapped)
    report = services.oidc_memberships_sync(user=founder, groups=["devs"])
    assert not (report.added or report.changed or report.removed)  # local: untouched
    assert Membership.objects.get(user=founder).role == Role.OWNER
    lead = services.oidc_user_sign_in(email="lead@corp.example", groups=["leads"])
    assert Membership.objects.get(user=lead).role == Role.OWNER
    founder_membership = Membership.objects.get(user=founder)
    services.membership_remove(
        tenant=mapped, actor=Actor(user=lead), membership=founder_membership
    )  # now the SSO lead is the only owner

    report = services.oidc_memberships_sync(user=lead, groups=["devs"])
    assert report.kept == [mapped.slug] and not report.changed
    assert Membership.objects.get(user=lead).role == Role.OWNER
    report = services.oidc_memberships_sync(user=lead, groups=[])
    assert report.kept == [mapped.slug] and not report.removed
    refused = AuditEvent.objects.filter(tenant=mapped, action="membership.sso_change_refused")
    assert refused.count() == 2


def test_unknown_tenants_are_ignored_and_disabled_accounts_refused(
    mapped: Tenant, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tenants.services.sso"):
        user = services.oidc_user_sign_in(email="max@corp.example", groups=["ghost"])
    assert not Membership.objects.filter(user=user).exists()
    assert not Tenant.objects.filter(slug="ghost-tenant").exists()
    assert "ghost-tenant" in caplog.text
    user.is_active = False
    user.save()
    with pytest.raises(PermissionDeniedError) as info:
        services.oidc_user_sign_in(email="MAX@corp.example", groups=["devs"])
    assert info.value.field == "email"
    with pytest.raises(ValidationFailed) as bad:
        services.oidc_user_sign_in(email="not an e-mail", groups=[])
    assert bad.value.field == "email"


def test_the_backend_never_answers_a_password_form(settings: Any, db: Any) -> None:
    settings.OIDC_ENABLED = True
    backend = oidc.Backend()
    assert backend.authenticate(None, username="a@b.example", password="x") is None
    request = Client().get("/accounts/login/?code=x&state=y").wsgi_request
    assert backend.authenticate(request, username="a@b.example", password="x") is None


@pytest.mark.parametrize(
    ("claims", "refusal"),
    [
        ({"iss": "https://evil.example/o", "aud": "portal"}, "issuer"),
        ({"iss": "https://idp.example/o", "aud": "other-client"}, "another client"),
        ({"iss": "https://idp.example/o", "aud": ["portal", "x"], "azp": "x"}, "authorized party"),
    ],
)
def test_id_tokens_for_another_issuer_or_client_are_refused(
    claims: dict[str, Any], refusal: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library checks the signature and the nonce; the backend adds issuer and audience."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    settings.OIDC_ENABLED = True
    settings.OIDC_RP_CLIENT_ID = "portal"
    settings.OIDC_RP_CLIENT_SECRET = "s"
    settings.OIDC_OP_ISSUER = "https://idp.example/o"
    for name in ("AUTHORIZATION", "TOKEN", "USER", "JWKS"):
        setattr(settings, f"OIDC_OP_{name}_ENDPOINT", f"https://idp.example/{name.lower()}")
    backend = oidc.Backend()
    backend._configure()
    monkeypatch.setattr(backend, "retrieve_matching_jwk", lambda token: key.public_key())
    token = jwt.encode(
        {**claims, "sub": "1", "nonce": "n", "exp": time.time() + 60},
        key,
        algorithm="RS256",
        headers={"kid": "k"},
    )
    with pytest.raises(SuspiciousOperation, match=refusal):
        backend.verify_token(token, nonce="n")
    good = jwt.encode(
        {"iss": "https://idp.example/o", "aud": "portal", "sub": "1", "nonce": "n"},
        key,
        algorithm="RS256",
    )
    assert backend.verify_token(good, nonce="n")["sub"] == "1"
