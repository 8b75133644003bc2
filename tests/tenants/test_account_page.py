"""The account page: the user's tenants and roles, the live API tokens they made in any of
them (never another user's, never a revoked one), password change, and two-factor below."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from tenants import services
from tenants.actors import Actor
from tenants.models import ApiToken
from tests.conftest import PASSWORD, TenantWorld

pytestmark = pytest.mark.django_db


def test_the_account_lists_tenants_and_only_my_live_tokens(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    mine, _ = services.api_token_create(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                                        name="ci deploys", scopes=["read"])  # fmt: skip
    gone, _ = services.api_token_create(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                                        name="old one", scopes=["read"])  # fmt: skip
    ApiToken.objects.filter(pk=gone.pk).update(revoked_at=timezone.now())
    client.force_login(world_a.owner)
    page = client.get(reverse("account-security")).content.decode()
    tokens = page.split('data-testid="account-tokens"')[1].split("</section>")[0]
    assert "ci deploys" in tokens and mine.prefix in tokens and "old one" not in tokens
    assert "automation" in tokens  # the world's own token, made by this owner
    assert world_b.token.prefix not in page  # another user's token in another tenant
    tenants = page.split('data-testid="account-tenants"')[1].split("</section>")[0]
    assert "Acme" in tenants and "Owner" in tenants and "Globex" not in tenants
    assert 'data-testid="two-factor-off"' in page and 'data-testid="password-change"' in page


def test_the_password_changes_with_the_current_one(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.viewer)
    url = reverse("password_change")
    assert 'data-testid="password-change-form"' in client.get(url).content.decode()
    wrong = client.post(url, {"old_password": "nope", "new_password1": "Fresh-pass-991",
                              "new_password2": "Fresh-pass-991"})  # fmt: skip
    assert (
        wrong.status_code == 200
        and "old password was entered incorrectly" in wrong.content.decode()
    )
    done = client.post(url, {"old_password": PASSWORD, "new_password1": "Fresh-pass-991",
                             "new_password2": "Fresh-pass-991"}, follow=True)  # fmt: skip
    assert 'data-testid="password-changed"' in done.content.decode()
    client.logout()
    assert client.login(username=world_a.viewer.username, password="Fresh-pass-991")
