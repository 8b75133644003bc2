"""Quota escape by tenant multiplication: tenants per user are capped, signup can be closed or
need e-mail verification, and login and signup attempts are throttled (429, Retry-After)."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail, signing
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from tenants import services
from tenants.actors import Actor
from tenants.models import Membership, Role
from tests.conftest import PASSWORD, TenantWorld, make_user

pytestmark = pytest.mark.django_db

SIGNUP = {"email": "new@startup.example", "password": PASSWORD, "organisation": "Startup"}


def _session(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


# --- tenants per user ------------------------------------------------------------------------


def test_the_api_refuses_a_tenant_beyond_the_limit_naming_the_field(
    world_a: TenantWorld, settings: Any
) -> None:
    settings.MAX_TENANTS_PER_USER = 3
    client = _session(world_a.owner)  # owns Acme already
    for n in (2, 3):
        assert client.post(reverse("tenant-list"), {"name": f"Acme {n}"}).status_code == 201
    response = client.post(reverse("tenant-list"), {"name": "Acme 4"}, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["name"]
    assert "3 tenants" in response.json()["error"]["message"]
    owned = Membership.objects.filter(user=world_a.owner, role=Role.OWNER)
    assert owned.count() == 3


def test_the_page_refuses_a_tenant_beyond_the_limit(
    client: Client, world_a: TenantWorld, settings: Any
) -> None:
    settings.MAX_TENANTS_PER_USER = 1
    client.force_login(world_a.owner)
    response = client.post(reverse("tenant-new"), {"name": "Second"})
    assert response.status_code == 200
    assert response.context["form"].errors["name"][0].startswith("You already own 1 tenant,")
    assert Membership.objects.filter(user=world_a.owner).count() == 1


def test_memberships_of_other_roles_do_not_count_and_staff_are_exempt(
    world_a: TenantWorld, settings: Any
) -> None:
    settings.MAX_TENANTS_PER_USER = 1
    services.tenant_create(owner=world_a.viewer, name="Mine", actor=Actor(user=world_a.viewer))
    staff = make_user("staff@platform.example")
    staff.is_staff = True
    staff.save()
    for n in range(3):
        services.tenant_create(owner=staff, name=f"Ops {n}", actor=Actor(user=staff))
    with pytest.raises(services.ValidationFailed) as exc:
        services.tenant_create(owner=world_a.viewer, name="More", actor=Actor(user=world_a.viewer))
    assert exc.value.field == "name"


def test_signup_names_the_organisation_field_when_no_tenant_is_allowed(settings: Any) -> None:
    settings.MAX_TENANTS_PER_USER = 0
    response = APIClient().post(reverse("api-signup"), SIGNUP, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["organisation"]
    assert not User.objects.filter(username=SIGNUP["email"]).exists()  # rolled back


# --- signup modes ----------------------------------------------------------------------------


def test_closed_signup_is_refused_on_the_page_and_the_api(client: Client, settings: Any) -> None:
    settings.SIGNUP_MODE = "closed"
    page = client.get(reverse("signup"))
    assert page.status_code == 403
    assert b"Signup is closed" in page.content
    assert client.post(reverse("signup"), SIGNUP).status_code == 403
    response = APIClient().post(reverse("api-signup"), SIGNUP, format="json")
    assert response.status_code == 403
    assert "closed" in response.json()["error"]["message"]
    assert not User.objects.filter(username=SIGNUP["email"]).exists()
    assert b'data-testid="signup-link"' not in client.get(reverse("login")).content
    settings.SIGNUP_MODE = "open"
    assert b'data-testid="signup-link"' in client.get(reverse("login")).content


def test_an_unknown_signup_mode_counts_as_closed(settings: Any) -> None:
    settings.SIGNUP_MODE = "opne"
    assert services.signup_mode() == "closed"


@pytest.fixture
def on_commit(django_capture_on_commit_callbacks: Any) -> Any:
    """Run the mail task the signup enqueues after commit (tests run in one transaction)."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def _verification_link() -> str:
    assert len(mail.outbox) == 1
    match = re.search(r"https?://\S+/accounts/verify/(\S+)/", mail.outbox[0].body)
    assert match, mail.outbox[0].body
    return reverse("signup-verify", args=[match.group(1)])


def _can_log_in(email: str) -> bool:
    return Client().login(username=email, password=PASSWORD)


def test_verify_signup_stays_inactive_until_the_link(
    client: Client, settings: Any, on_commit: Any
) -> None:
    settings.SIGNUP_MODE = "verify"
    mail.outbox.clear()
    with on_commit():
        response = client.post(reverse("signup"), SIGNUP)
    assert response.status_code == 200 and b'data-testid="verify-sent"' in response.content
    user = User.objects.get(username=SIGNUP["email"])
    assert not user.is_active and "_auth_user_id" not in client.session
    assert Membership.objects.get(user=user).role == Role.OWNER  # the tenant exists already
    assert mail.outbox[0].to == [SIGNUP["email"]]
    link = _verification_link()
    assert not _can_log_in(SIGNUP["email"])
    page = client.post(reverse("login"), {"username": SIGNUP["email"], "password": PASSWORD})
    assert page.status_code == 200 and "_auth_user_id" not in client.session
    assert client.get(link).status_code == 302
    user.refresh_from_db()
    assert user.is_active and _can_log_in(SIGNUP["email"])
    again = client.get(link)  # a link works once
    assert again.status_code == 400 and b"not valid" in again.content


def test_verify_signup_through_the_api_gives_no_session(settings: Any, on_commit: Any) -> None:
    settings.SIGNUP_MODE = "verify"
    mail.outbox.clear()
    client = APIClient()
    with on_commit():
        response = client.post(reverse("api-signup"), SIGNUP, format="json")
    assert response.status_code == 201 and response.json()["verification_required"] is True
    assert client.get(reverse("tenant-list")).status_code in (401, 403)
    _verification_link()


def test_an_expired_verification_link_is_refused(
    client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch, on_commit: Any
) -> None:
    settings.SIGNUP_MODE = "verify"
    settings.SIGNUP_VERIFY_TTL_HOURS = 48
    mail.outbox.clear()
    with on_commit():
        client.post(reverse("signup"), SIGNUP)
    link = _verification_link()
    later = time.time() + 48 * 3600 + 5
    monkeypatch.setattr(signing, "time", SimpleNamespace(time=lambda: later))
    response = client.get(link)
    assert response.status_code == 400 and b"expired" in response.content
    assert not User.objects.get(username=SIGNUP["email"]).is_active


def test_a_tampered_verification_link_is_refused(
    client: Client, settings: Any, on_commit: Any
) -> None:
    settings.SIGNUP_MODE = "verify"
    mail.outbox.clear()
    with on_commit():
        client.post(reverse("signup"), SIGNUP)
    token = _verification_link().rstrip("/").rsplit("/", 1)[1]
    other = make_user("other@startup.example")
    payload, _, rest = token.partition(":")
    forged = signing.dumps({"u": other.pk, "f": "0" * 20}, salt="wrong-salt")
    for bad in (payload + "x:" + rest, forged, "garbage"):
        response = client.get(reverse("signup-verify", args=[bad]))
        assert response.status_code == 400 and b"not valid" in response.content
    assert not User.objects.get(username=SIGNUP["email"]).is_active


# --- throttles -------------------------------------------------------------------------------


def _login(client: Client, email: str, password: str, ip: str = "127.0.0.1") -> Any:
    return client.post(reverse("login"), {"username": email, "password": password}, REMOTE_ADDR=ip)


def test_login_is_throttled_per_email_and_the_right_password_waits_too(
    client: Client, world_a: TenantWorld, settings: Any
) -> None:
    settings.LOGIN_THROTTLE_PER_EMAIL = 5
    email = world_a.owner.email
    for _ in range(5):
        assert _login(client, email, "wrong-password").status_code == 200  # form error
    response = _login(client, email, "wrong-password")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert b'data-testid="throttled"' in response.content
    right = _login(client, "  " + email.upper() + " ", PASSWORD)  # the same e-mail, normalised
    assert right.status_code == 429 and "_auth_user_id" not in client.session
    other = _login(Client(), world_a.viewer.email, PASSWORD)  # someone else is not blocked
    assert other.status_code == 302


def test_login_is_throttled_per_ip_across_emails(client: Client, settings: Any) -> None:
    settings.LOGIN_THROTTLE_PER_IP = 3
    for n in range(3):
        assert _login(client, f"guess{n}@x.example", "nope", ip="127.0.0.9").status_code == 200
    assert _login(client, "guess9@x.example", "nope", ip="127.0.0.9").status_code == 429
    assert _login(client, "guess9@x.example", "nope", ip="127.0.0.8").status_code == 200


def test_signup_is_throttled_per_ip(settings: Any) -> None:
    settings.SIGNUP_THROTTLE_PER_IP = 2
    client = APIClient()
    bad = {**SIGNUP, "email": "not-an-email"}
    for _ in range(2):
        assert client.post(reverse("api-signup"), bad, format="json").status_code == 400
    response = client.post(reverse("api-signup"), SIGNUP, format="json")
    assert response.status_code == 429 and int(response["Retry-After"]) >= 1
    assert not User.objects.filter(username=SIGNUP["email"]).exists()
    page = Client().post(reverse("signup"), SIGNUP)
    assert page.status_code == 429 and b'data-testid="throttled"' in page.content
