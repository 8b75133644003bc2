"""Server-rendered pages: onboarding, members, tokens, audit log, password reset, isolation."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from tenants.models import ApiToken, Invitation, Membership
from tests.conftest import PASSWORD, TenantWorld, make_user

pytestmark = pytest.mark.django_db


def test_signup_page_lands_in_the_new_tenant(client) -> None:
    response = client.post(
        reverse("signup"),
        {"email": "page@new.example", "password": PASSWORD, "organisation": "Page Co"},
        follow=True,
    )
    assert response.redirect_chain[-1][0] == "/t/page-co/"
    assert b"Page Co" in response.content and b"owner" in response.content
    assert Membership.objects.get(user__email="page@new.example").role == "owner"


def test_signup_page_shows_field_errors_and_writes_nothing(client) -> None:
    response = client.post(
        reverse("signup"), {"email": "x@new.example", "password": "123", "organisation": "X"}
    )
    assert response.status_code == 200
    assert b"errorlist" in response.content
    assert not User.objects.filter(email="x@new.example").exists()


def test_pages_of_another_tenant_are_404(
    client, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    client.force_login(world_b.owner)
    for name in ("tenant-overview", "tenant-members", "tenant-tokens", "tenant-audit"):
        assert client.get(reverse(name, args=[world_a.tenant.slug])).status_code == 404
    url = reverse("token-revoke", args=[world_a.tenant.slug, world_a.token.pk])
    assert client.post(url).status_code == 404
    url = reverse("token-revoke", args=[world_b.tenant.slug, world_a.token.pk])
    assert client.post(url).status_code == 404
    world_a.token.refresh_from_db()
    assert world_a.token.revoked_at is None


def test_tokens_page_shows_the_secret_once_and_revokes(client, world_a: TenantWorld) -> None:
    client.force_login(world_a.owner)
    url = reverse("tenant-tokens", args=[world_a.tenant.slug])
    response = client.post(url, {"name": "page-token", "scopes": ["read"], "expires_in_days": 30})
    secret = re.search(rb'data-testid="token-secret">(aop_[^<]+)<', response.content).group(1)
    assert secret.decode().startswith("aop_")
    assert secret not in client.get(url).content
    token = ApiToken.objects.get(name="page-token")
    row = client.post(
        reverse("token-revoke", args=[world_a.tenant.slug, token.pk]), HTTP_HX_REQUEST="true"
    )
    assert b"revoked" in row.content and b"<tr" in row.content
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_viewer_and_operator_cannot_open_token_management(client, world_a: TenantWorld) -> None:
    for user in (world_a.viewer, world_a.operator):
        client.force_login(user)
        assert client.get(reverse("tenant-tokens", args=[world_a.tenant.slug])).status_code == 403
        response = client.post(
            reverse("tenant-members", args=[world_a.tenant.slug]),
            {"email": "sneaky@acme.example", "role": "owner"},
        )
        assert response.status_code == 403
    assert not Invitation.objects.filter(email="sneaky@acme.example").exists()


def test_invite_accept_role_change_and_remove_in_pages(client, world_a: TenantWorld) -> None:
    client.force_login(world_a.owner)
    members_url = reverse("tenant-members", args=[world_a.tenant.slug])
    response = client.post(members_url, {"email": "joiner@acme.example", "role": "operator"})
    link = re.search(rb'data-testid="invite-url">[^<]*(/invite/[^<]+/)<', response.content).group(1)
    joiner = make_user("joiner@acme.example")
    client.force_login(joiner)
    assert b"Accept invitation" in client.get(link.decode()).content
    response = client.post(link.decode(), follow=True)
    assert response.redirect_chain[-1][0] == f"/t/{world_a.tenant.slug}/"
    membership = Membership.objects.get(tenant=world_a.tenant, user=joiner)
    assert membership.role == "operator"
    client.force_login(world_a.owner)
    client.post(
        reverse("member-role", args=[world_a.tenant.slug, membership.pk]), {"role": "viewer"}
    )
    membership.refresh_from_db()
    assert membership.role == "viewer"
    client.post(reverse("member-remove", args=[world_a.tenant.slug, membership.pk]))
    assert not Membership.objects.filter(pk=membership.pk).exists()
    audit = client.get(
        reverse("tenant-audit", args=[world_a.tenant.slug]), {"action": "membership."}
    )
    assert b"membership.removed" in audit.content and b"membership.role_changed" in audit.content


def test_password_reset_sends_a_working_link(client, world_a: TenantWorld, mailoutbox) -> None:
    client.post(reverse("password_reset"), {"email": world_a.owner.email})
    assert len(mailoutbox) == 1
    link = re.search(r"https?://[^/]+(/accounts/reset/\S+/)", mailoutbox[0].body).group(1)
    form_page = client.get(link, follow=True)
    action = form_page.redirect_chain[-1][0]
    client.post(
        action, {"new_password1": "Brand-new-pass-77", "new_password2": "Brand-new-pass-77"}
    )
    assert client.login(username=world_a.owner.username, password="Brand-new-pass-77")


def test_tenant_switcher_lists_all_tenants(client, world_a: TenantWorld) -> None:
    from tenants import services
    from tenants.actors import Actor

    second = services.tenant_create(
        owner=world_a.owner, name="Acme Research", actor=Actor(user=world_a.owner)
    )
    client.force_login(world_a.owner)
    page = client.get(reverse("tenant-overview", args=[world_a.tenant.slug])).content.decode()
    assert 'id="tenant-switcher"' in page and second.slug in page
    response = client.post(reverse("tenant-switch"), {"slug": second.slug})
    assert response["Location"] == f"/t/{second.slug}/"
    assert client.get(reverse("home"))["Location"] == f"/t/{second.slug}/"


def test_anonymous_is_sent_to_login(client, world_a: TenantWorld) -> None:
    response = client.get(reverse("tenant-members", args=[world_a.tenant.slug]))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
