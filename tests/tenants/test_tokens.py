"""API tokens: hash only at rest, shown once, expired / revoked / unknown tokens refused."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from portal.exceptions import ValidationFailed
from tenants import services
from tenants.actors import Actor
from tenants.models import ApiToken
from tenants.secrets import hash_secret
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_created_token_is_shown_once_and_works(world_a: TenantWorld) -> None:
    owner = world_a.client("owner")
    response = owner.post(
        reverse("token-list"),
        {"name": "deployer", "scopes": ["read", "deploy"], "expires_in_days": 7},
        format="json",
    )
    assert response.status_code == 201
    raw = response.json()["token"]
    assert raw.startswith("aop_") and response.json()["prefix"] == raw[:12]
    token = ApiToken.objects.get(pk=response.json()["id"])
    assert token.token_hash == hash_secret(raw)
    assert raw not in str(ApiToken.objects.filter(pk=token.pk).values().get())
    assert (token.expires_at - timezone.now()).days in (6, 7)
    listing = owner.get(reverse("token-list")).content.decode()
    detail = owner.get(reverse("token-detail", kwargs={"pk": token.pk})).content.decode()
    assert raw not in listing and raw not in detail and "token_hash" not in listing
    assert _bearer(raw).get(reverse("member-list")).status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_rate_limit_beyond_the_column_is_a_400_not_a_500(world_a: TenantWorld) -> None:
    """Found while fuzzing the API: 2**31 reached PostgreSQL ("integer out of range")."""
    client = world_a.client("token")
    for too_big in (services.TOKEN_RATE_LIMIT_MAX + 1, 10**20):
        response = client.post(
            reverse("token-list"),
            {"name": "fast", "scopes": ["read"], "rate_limit_per_second": too_big},
            format="json",
        )
        assert response.status_code == 400
        assert list(response.json()["error"]["fields"]) == ["rate_limit_per_second"]
    with pytest.raises(ValidationFailed):
        services.api_token_create(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), name="fast",
            scopes=["read"], rate_limit_per_second=services.TOKEN_RATE_LIMIT_MAX + 1,
        )  # fmt: skip
    token, _ = services.api_token_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), name="fastest",
        scopes=["read"], rate_limit_per_second=services.TOKEN_RATE_LIMIT_MAX,
    )  # fmt: skip
    assert token.rate_limit_per_second == services.TOKEN_RATE_LIMIT_MAX
    assert not ApiToken.objects.filter(tenant=world_a.tenant, name="fast").exists()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: setattr(t, "expires_at", timezone.now() - timedelta(seconds=1)), "expired"),
        (lambda t: setattr(t, "revoked_at", timezone.now()), "revoked"),
    ],
    ids=["expired", "revoked"],
)
def test_expired_and_revoked_tokens_are_refused(world_a: TenantWorld, mutate, message) -> None:
    mutate(world_a.token)
    world_a.token.save()
    response = world_a.client("token").get(reverse("member-list"))
    assert response.status_code == 401
    assert message in response.json()["error"]["message"]
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header",
    ["Bearer aop_not-a-real-token-value-at-all", "Bearer", "Bearer a b", "Bearer sk-foreign"],
)
def test_unknown_or_malformed_tokens_are_refused(world_a: TenantWorld, header: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get(reverse("member-list"))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_revoke_through_the_api_stops_the_token_at_once(world_a: TenantWorld) -> None:
    victim = world_a.client("token")
    assert victim.get(reverse("member-list")).status_code == 200
    response = world_a.client("owner").delete(
        reverse("token-detail", kwargs={"pk": world_a.token.pk})
    )
    assert response.status_code == 204
    assert victim.get(reverse("member-list")).status_code == 401
    listed = world_a.client("owner").get(reverse("token-list"), {"active": "false"}).json()
    assert [t["status"] for t in listed["results"]] == ["revoked"]


def test_suspended_tenant_tokens_are_refused(world_a: TenantWorld) -> None:
    world_a.tenant.is_active = False
    world_a.tenant.save()
    response = world_a.client("token").get(reverse("member-list"))
    assert response.status_code == 401
    assert "suspended" in response.json()["error"]["message"]


def test_token_last_used_is_written_at_most_once_a_minute(
    world_a: TenantWorld, django_assert_num_queries
) -> None:
    client = world_a.client("token")
    client.get(reverse("quota-list"))
    first = ApiToken.objects.get(pk=world_a.token.pk).last_used_at
    client.get(reverse("quota-list"))
    assert ApiToken.objects.get(pk=world_a.token.pk).last_used_at == first


def test_revocation_reaches_a_warm_token_cache_at_once(world_a: TenantWorld) -> None:
    """Another process revoking (no local cache drop) still stops the token on the next call."""
    from tenants.actors import Actor
    from tenants.auth import token_cache

    client = world_a.client("token")
    assert client.get(reverse("quota-list")).status_code == 200
    assert token_cache.get(world_a.token.token_hash) is not None
    services.api_token_revoke(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), token=world_a.token
    )
    assert token_cache.get(world_a.token.token_hash) is not None  # still cached here
    response = client.get(reverse("quota-list"))
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]


def test_token_cache_expires_so_suspension_applies(world_a: TenantWorld, settings) -> None:
    client = world_a.client("token")
    assert client.get(reverse("quota-list")).status_code == 200
    world_a.tenant.is_active = False
    world_a.tenant.save()
    settings.API_TOKEN_CACHE_SECONDS = 0
    assert client.get(reverse("quota-list")).status_code == 401


def test_token_requests_need_no_postgres_when_warm(
    world_a: TenantWorld, django_assert_num_queries
) -> None:
    client = world_a.client("token")
    client.get(reverse("quota-list"))
    with django_assert_num_queries(1):  # the quota list itself
        assert client.get(reverse("quota-list")).status_code == 200
