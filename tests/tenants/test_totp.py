"""Two-factor sign-in for password accounts: enrolment from the account page, the login's
second step (the session is not signed in until the code is right), wrong codes, replay,
recovery codes, throttling, disabling; single sign-on accounts and API tokens untouched."""

from __future__ import annotations

import re
from typing import Any

import pyotp
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from portal.exceptions import PermissionDeniedError
from tenants import services
from tenants.actors import Actor
from tenants.mfa import services as mfa
from tenants.models import AuditEvent, RecoveryCode, Scope, Tenant, TotpDevice
from tests.conftest import PASSWORD, make_user

pytestmark = pytest.mark.django_db


def code(secret: str, steps_ahead: int = 0) -> str:
    """The authenticator's code, `steps_ahead` 30-second steps from now."""
    totp = pyotp.TOTP(secret)
    return totp.generate_otp(totp.timecode(timezone.now()) + steps_ahead)


def next_code(user: User) -> str:
    """The code of the step after the newest one spent: still within the allowed drift."""
    device = TotpDevice.objects.get(user=user)
    return pyotp.TOTP(device.secret).generate_otp(device.last_used_step + 1)


def spent_code(user: User) -> str:
    device = TotpDevice.objects.get(user=user)
    return pyotp.TOTP(device.secret).generate_otp(device.last_used_step)


def wrong_code(secret: str) -> str:
    valid = {code(secret, k) for k in (-1, 0, 1)}
    return next(c for c in ("000000", "111111", "222222", "333333") if c not in valid)


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def alice() -> tuple[User, Tenant]:
    user = make_user("alice@corp.example")
    tenant = services.tenant_create(owner=user, name="Alice Labs", actor=Actor(user=user))
    return user, tenant


def enrol(user: User) -> tuple[str, list[str]]:
    """Two-factor on, the way the account page does it; the secret and the recovery codes."""
    client = Client()
    client.force_login(user)
    page = client.post("/accounts/security/", {"action": "start"}).content.decode()
    secret = re.search(r'data-testid="totp-secret">([A-Z2-7]+)<', page).group(1)
    page = client.post("/accounts/security/", {"action": "confirm", "code": code(secret)})
    codes = re.findall(r"\b[a-z2-9]{5}-[a-z2-9]{5}\b", page.content.decode())
    return secret, codes


def password_step(client: Client, user: User, next_url: str = "") -> Any:
    url = "/accounts/login/" + (f"?next={next_url}" if next_url else "")
    return client.post(url, {"username": user.username, "password": PASSWORD})


def test_enrolment_shows_the_secret_once_then_asks_for_a_code(alice: Any) -> None:
    user, tenant = alice
    client = Client()
    client.force_login(user)
    page = client.get("/accounts/security/").content.decode()
    assert 'data-testid="two-factor-off"' in page and "totp-secret" not in page

    page = client.post("/accounts/security/", {"action": "start"}).content.decode()
    uri = re.search(r'data-testid="otpauth-uri">([^<]+)<', page).group(1)
    secret = re.search(r'data-testid="totp-secret">([A-Z2-7]+)<', page).group(1)
    assert uri.startswith("otpauth://totp/") and f"secret={secret}" in uri
    assert "issuer=AI%20Ops%20Portal" in uri
    again = client.get("/accounts/security/").content.decode()
    assert secret not in again and 'data-testid="confirm-form"' in again  # shown once

    bad = client.post("/accounts/security/", {"action": "confirm", "code": wrong_code(secret)})
    assert "That code is not right" in bad.content.decode()
    assert TotpDevice.objects.get(user=user).confirmed_at is None

    page = client.post("/accounts/security/", {"action": "confirm", "code": code(secret)})
    codes = re.findall(r"\b[a-z2-9]{5}-[a-z2-9]{5}\b", page.content.decode())
    assert len(set(codes)) == 10
    device = TotpDevice.objects.get(user=user)
    assert device.confirmed_at is not None
    stored = set(RecoveryCode.objects.filter(device=device).values_list("code_hash", flat=True))
    assert len(stored) == 10 and not stored & set(codes)  # digests only
    assert AuditEvent.objects.filter(tenant=tenant, action="user.two_factor_enabled").exists()
    later = client.get("/accounts/security/").content.decode()
    assert 'data-testid="two-factor-on"' in later and codes[0] not in later


def test_the_password_alone_does_not_sign_in_then_the_code_does(alice: Any) -> None:
    user, _ = alice
    secret, _ = enrol(user)
    client = Client()
    response = password_step(client, user, next_url="/accounts/security/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/code/"
    assert not signed_in(client)
    assert client.get("/accounts/security/").status_code == 302  # still anonymous

    page = client.post("/accounts/login/code/", {"code": wrong_code(secret)})
    assert page.status_code == 200 and "That code is not right" in page.content.decode()
    assert not signed_in(client)

    # The enrolment spent this step's code: the app's next one (within the drift) works.
    response = client.post("/accounts/login/code/", {"code": next_code(user)})
    assert response.status_code == 302 and response["Location"] == "/accounts/security/"
    assert signed_in(client)
    assert client.get("/accounts/login/code/").status_code == 302  # nothing pending any more


def test_a_used_code_is_not_accepted_again(alice: Any) -> None:
    user, _ = alice
    secret, _ = enrol(user)
    used = spent_code(user)  # the enrolment's own code
    client = Client()
    password_step(client, user)
    page = client.post("/accounts/login/code/", {"code": used}).content.decode()
    assert "already used" in page and not signed_in(client)

    fresh = next_code(user)
    assert client.post("/accounts/login/code/", {"code": fresh}).status_code == 302
    other = Client()  # someone who saw that code over the shoulder, with the password
    password_step(other, user)
    assert "already used" in other.post("/accounts/login/code/", {"code": fresh}).content.decode()
    assert not signed_in(other)


def test_a_recovery_code_signs_in_once(alice: Any) -> None:
    user, tenant = alice
    _, codes = enrol(user)
    client = Client()
    password_step(client, user)
    response = client.post("/accounts/login/code/", {"code": codes[3].upper()}, follow=True)
    assert signed_in(client)
    assert "You used a recovery code; 9 left." in response.content.decode()
    assert AuditEvent.objects.filter(tenant=tenant, action="user.recovery_code_used").exists()

    again = Client()
    password_step(again, user)
    page = again.post("/accounts/login/code/", {"code": codes[3]}).content.decode()
    assert "That code is not right" in page and not signed_in(again)


def test_codes_are_throttled_like_the_login(alice: Any, settings: Any) -> None:
    settings.TOTP_THROTTLE_PER_USER = 4  # the enrolment's code is one of them
    user, _ = alice
    secret, _ = enrol(user)
    spent = TotpDevice.objects.get(user=user).last_used_step
    client = Client()
    password_step(client, user)
    for _ in range(3):
        assert client.post("/accounts/login/code/", {"code": wrong_code(secret)}).status_code == 200
    throttled = client.post("/accounts/login/code/", {"code": next_code(user)})
    assert throttled.status_code == 429 and int(throttled["Retry-After"]) > 0
    assert 'data-testid="throttled"' in throttled.content.decode()
    assert not signed_in(client)  # the right code was not even looked at: nor spent
    assert TotpDevice.objects.get(user=user).last_used_step == spent


def test_the_second_step_expires_and_needs_the_password_first(alice: Any, settings: Any) -> None:
    user, _ = alice
    secret, _ = enrol(user)
    client = Client()
    assert client.get("/accounts/login/code/")["Location"] == "/accounts/login/"
    assert client.post("/accounts/login/code/", {"code": code(secret, 1)}).status_code == 302
    assert not signed_in(client)
    password_step(client, user)
    settings.TOTP_PENDING_S = 0
    response = client.post("/accounts/login/code/", {"code": code(secret, 1)})
    assert response["Location"] == "/accounts/login/" and not signed_in(client)


def test_disabling_needs_the_password_and_a_code(alice: Any) -> None:
    user, tenant = alice
    secret, codes = enrol(user)
    client = Client()
    client.force_login(user)
    form = {"action": "disable", "password": "wrong", "code": code(secret, 1)}
    assert "The password is not right" in client.post("/accounts/security/", form).content.decode()
    form = {"action": "disable", "password": PASSWORD, "code": wrong_code(secret)}
    assert "That code is not right" in client.post("/accounts/security/", form).content.decode()
    assert TotpDevice.objects.filter(user=user).exists()

    form = {"action": "disable", "password": PASSWORD, "code": codes[0]}
    assert client.post("/accounts/security/", form).status_code == 302
    assert not TotpDevice.objects.filter(user=user).exists()
    assert not RecoveryCode.objects.exists()
    assert AuditEvent.objects.filter(tenant=tenant, action="user.two_factor_disabled").exists()
    fresh = Client()
    assert password_step(fresh, user)["Location"] == "/"  # the password alone again
    assert signed_in(fresh)


def test_sso_accounts_are_not_offered_two_factor(db: Any) -> None:
    user = User.objects.create_user(username="sso@corp.example", email="sso@corp.example")
    assert not user.has_usable_password()
    client = Client()
    client.force_login(user)
    page = client.post("/accounts/security/", {"action": "start"}).content.decode()
    assert 'data-testid="sso-only"' in page
    assert not TotpDevice.objects.filter(user=user).exists()
    with pytest.raises(PermissionDeniedError):
        mfa.totp_enrolment_start(user=user)


def test_api_tokens_are_unaffected_by_two_factor(alice: Any) -> None:
    user, tenant = alice
    enrol(user)
    _, raw = services.api_token_create(
        tenant=tenant, actor=Actor(user=user), name="ci", scopes=[Scope.READ], expires_in_days=1
    )
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/tenants/").status_code == 200


def test_the_account_page_needs_a_session(db: Any) -> None:
    response = Client().get("/accounts/security/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
