from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from portal.exceptions import ConflictError, PermissionDeniedError, ValidationFailed
from tenants import services
from tenants.actors import Actor
from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Quota, Role
from tenants.secrets import hash_secret
from tests.conftest import PASSWORD, TenantWorld, make_user

pytestmark = pytest.mark.django_db


def test_signup_creates_owner_tenant_quota_and_audit() -> None:
    user, tenant = services.signup(
        email="Alice@Example.com", password=PASSWORD, organisation="Alice Labs"
    )
    assert user.email == "alice@example.com"
    assert tenant.slug == "alice-labs"
    assert Membership.objects.get(tenant=tenant, user=user).role == Role.OWNER
    quota = Quota.objects.get(tenant=tenant)
    assert quota.max_deployments == services.PLAN_QUOTAS["free"]["max_deployments"]
    actions = set(AuditEvent.objects.filter(tenant=tenant).values_list("action", flat=True))
    assert {"tenant.created", "membership.created"} <= actions


@pytest.mark.parametrize(
    ("email", "password", "organisation", "field"),
    [
        ("not-an-email", PASSWORD, "Org", "email"),
        ("bob@example.com", "123", "Org", "password"),
        ("bob@example.com", PASSWORD, "  ", "organisation"),
    ],
)
def test_signup_rejects_bad_input_and_writes_nothing(email, password, organisation, field) -> None:
    with pytest.raises(ValidationFailed) as info:
        services.signup(email=email, password=password, organisation=organisation)
    assert info.value.field == field
    assert not User.objects.exists()


def test_signup_refuses_duplicate_email() -> None:
    services.signup(email="dup@example.com", password=PASSWORD, organisation="One")
    with pytest.raises(ValidationFailed) as info:
        services.signup(email="DUP@example.com", password=PASSWORD, organisation="Two")
    assert info.value.field == "email"


def test_two_tenants_with_the_same_name_get_distinct_slugs() -> None:
    _, first = services.signup(email="a@x.example", password=PASSWORD, organisation="Same")
    _, second = services.signup(email="b@x.example", password=PASSWORD, organisation="Same")
    assert first.slug != second.slug


def test_invitation_must_match_the_email_and_is_single_use(world_a: TenantWorld) -> None:
    owner = Actor(user=world_a.owner)
    invitation, raw = services.invitation_create(
        tenant=world_a.tenant, actor=owner, email="new@acme.example", role=Role.VIEWER
    )
    assert invitation.token_hash == hash_secret(raw)
    assert raw not in str(Invitation.objects.filter(pk=invitation.pk).values().first())
    stranger = make_user("stranger@evil.example")
    with pytest.raises(ValidationFailed):
        services.invitation_accept(user=stranger, raw_token=raw)
    newcomer = make_user("new@acme.example")
    membership = services.invitation_accept(user=newcomer, raw_token=raw)
    assert membership.role == Role.VIEWER
    with pytest.raises(ValidationFailed, match="accepted"):
        services.invitation_accept(user=newcomer, raw_token=raw)


def test_invitation_sends_email_after_commit(
    world_a: TenantWorld, mailoutbox, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        _, raw = services.invitation_create(
            tenant=world_a.tenant,
            actor=Actor(user=world_a.owner),
            email="mail@acme.example",
            role=Role.OPERATOR,
        )
    assert len(mailoutbox) == 1
    assert mailoutbox[0].to == ["mail@acme.example"]
    assert f"/invite/{raw}/" in mailoutbox[0].body


def test_revoked_and_expired_invitations_cannot_be_accepted(world_a: TenantWorld) -> None:
    from datetime import timedelta

    from django.utils import timezone

    owner = Actor(user=world_a.owner)
    revoked, raw_revoked = services.invitation_create(
        tenant=world_a.tenant, actor=owner, email="r@acme.example", role=Role.VIEWER
    )
    services.invitation_revoke(tenant=world_a.tenant, actor=owner, invitation=revoked)
    _, raw_old = services.invitation_create(
        tenant=world_a.tenant, actor=owner, email="e@acme.example", role=Role.VIEWER
    )
    assert services.invitations_expire(now=timezone.now() + timedelta(days=30)) == 1
    for email, raw in (("r@acme.example", raw_revoked), ("e@acme.example", raw_old)):
        with pytest.raises(ValidationFailed):
            services.invitation_accept(user=make_user(email), raw_token=raw)


def test_last_owner_cannot_be_demoted_or_removed(world_a: TenantWorld) -> None:
    owner_membership = Membership.objects.get(tenant=world_a.tenant, user=world_a.owner)
    actor = Actor(user=world_a.owner)
    with pytest.raises(ConflictError):
        services.membership_set_role(
            tenant=world_a.tenant, actor=actor, membership=owner_membership, role=Role.VIEWER
        )
    with pytest.raises(ConflictError):
        services.membership_remove(tenant=world_a.tenant, actor=actor, membership=owner_membership)
    operator = Membership.objects.get(tenant=world_a.tenant, user=world_a.operator)
    services.membership_set_role(
        tenant=world_a.tenant, actor=actor, membership=operator, role=Role.OWNER
    )
    services.membership_set_role(
        tenant=world_a.tenant, actor=actor, membership=owner_membership, role=Role.VIEWER
    )
    event = AuditEvent.objects.filter(action="membership.role_changed").latest("id")
    assert event.before == {"role": "owner"} and event.after == {"role": "viewer"}
    assert event.actor_id == world_a.owner.pk


def test_token_is_stored_only_as_hash(world_a: TenantWorld) -> None:
    token, raw = services.api_token_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), name="ci", scopes=["read"]
    )
    row = ApiToken.objects.filter(pk=token.pk).values().get()
    assert raw not in str(row)
    assert row["token_hash"] == hash_secret(raw)
    assert raw.startswith(row["prefix"]) and len(row["prefix"]) < len(raw) // 3
    audit = AuditEvent.objects.filter(action="api_token.created").latest("id")
    assert raw not in str(audit.after)


def test_quota_changes_need_platform_staff(world_a: TenantWorld) -> None:
    with pytest.raises(PermissionDeniedError):
        services.quota_update(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), changes={"max_gpus": 99}
        )
    staff = make_user("sre@platform.example")
    staff.is_staff = True
    staff.save()
    quota = services.quota_update(
        tenant=world_a.tenant, actor=Actor(user=staff), changes={"max_gpus": 4}
    )
    assert quota.max_gpus == 4
    event = AuditEvent.objects.get(tenant=world_a.tenant, action="quota.updated")
    assert event.before["max_gpus"] == 1 and event.after["max_gpus"] == 4
