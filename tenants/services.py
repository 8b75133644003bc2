"""All writes of the tenants room: onboarding, members, invitations, tokens, quotas, audit."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, models, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify

from portal import ratelimit
from portal.exceptions import ConflictError, PermissionDeniedError, ValidationFailed
from tenants.actors import Actor
from tenants.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Membership,
    Plan,
    Quota,
    Role,
    Scope,
    Tenant,
)

PLAN_QUOTAS: dict[str, dict[str, int]] = {
    Plan.FREE: {
        "max_deployments": 3,
        "max_replicas": 4,
        "max_gpus": 1,
        "max_kv_blocks": 4096,
        "requests_per_second": 20,
        "max_storage_bytes": 10 * 2**30,
        "max_drills": 10,
        "max_concurrent_drill_runs": 1,
    },
    Plan.TEAM: {
        "max_deployments": 20,
        "max_replicas": 32,
        "max_gpus": 8,
        "max_kv_blocks": 65536,
        "requests_per_second": 100,
        "max_storage_bytes": 200 * 2**30,
        "max_drills": 50,
        "max_concurrent_drill_runs": 3,
    },
    Plan.ENTERPRISE: {
        "max_deployments": 200,
        "max_replicas": 256,
        "max_gpus": 64,
        "max_kv_blocks": 1048576,
        "requests_per_second": 500,
        "max_storage_bytes": 2 * 2**40,
        "max_drills": 200,
        "max_concurrent_drill_runs": 10,
    },
}
QUOTA_FIELDS = tuple(PLAN_QUOTAS[Plan.FREE])
TOKEN_PREFIX = "aop_"  # noqa: S105 (a public marker, not a secret)
INVITATION_PREFIX = "inv_"
TOKEN_RATE_LIMIT_MAX = 2**31 - 1  # what the column (PositiveIntegerField) holds


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _snapshot(obj: models.Model, fields: tuple[str, ...]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in fields:
        value = getattr(obj, name)
        data[name] = value.isoformat() if isinstance(value, datetime) else value
    return data


# --- audit ------------------------------------------------------------------------------


def audit_record(
    *,
    tenant: Tenant,
    actor: Actor,
    action: str,
    obj: models.Model,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit row; called by every service inside its own transaction."""
    return AuditEvent.objects.create(
        tenant=tenant,
        actor_id=actor.user_id,
        actor_token=actor.token,
        actor_label=actor.label[:200],
        action=action,
        object_type=obj._meta.label_lower,
        object_id=str(obj.pk),
        object_repr=str(obj)[:200],
        before=before,
        after=after,
    )


# --- tenants and onboarding --------------------------------------------------------------


def _unique_slug(name: str) -> str:
    base = slugify(name)[:40] or "tenant"
    slug = base
    while Tenant.objects.filter(slug=slug).exists():
        slug = f"{base}-{secrets.token_hex(3)}"
    return slug


def tenant_create(*, owner: User, name: str, actor: Actor, plan: str = Plan.FREE) -> Tenant:
    """Create a tenant with `owner` as its first owner and the plan's default quotas."""
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("Organisation name is required.", field="name")
    if plan not in PLAN_QUOTAS:
        raise ValidationFailed(f"Unknown plan {plan!r}.", field="plan")
    with transaction.atomic():
        tenant = Tenant(slug=_unique_slug(name), name=name, plan=plan)
        tenant.full_clean()
        tenant.save()
        membership = Membership(tenant=tenant, user=owner, role=Role.OWNER)
        membership.save()
        quota = Quota(tenant=tenant, **PLAN_QUOTAS[plan])
        quota.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="tenant.created",
            obj=tenant,
            after=_snapshot(tenant, ("slug", "name", "plan")),
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="membership.created",
            obj=membership,
            after={"user": owner.get_username(), "role": Role.OWNER},
        )
    return tenant


def signup(*, email: str, password: str, organisation: str) -> tuple[User, Tenant]:
    """Self-service onboarding: a new user and a new tenant they own, atomically."""
    user_model = get_user_model()
    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationFailed("Enter a valid e-mail address.", field="email") from None
    if not (organisation or "").strip():
        raise ValidationFailed("Organisation name is required.", field="organisation")
    if user_model.objects.filter(username=email).exists():
        raise ValidationFailed("An account with this e-mail already exists.", field="email")
    candidate = user_model(username=email, email=email)
    try:
        password_validation.validate_password(password or "", user=candidate)
    except ValidationError as exc:
        raise ValidationFailed(" ".join(exc.messages), field="password") from None
    with transaction.atomic():
        user = user_model.objects.create_user(username=email, email=email, password=password)
        tenant = tenant_create(owner=user, name=organisation, actor=Actor(user=user))
    return user, tenant


def tenant_update(*, tenant: Tenant, actor: Actor, name: str) -> Tenant:
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("Name must not be empty.", field="name")
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        before = _snapshot(locked, ("name",))
        locked.name = name
        locked.full_clean()
        locked.save(update_fields=["name"])
        audit_record(
            tenant=locked,
            actor=actor,
            action="tenant.updated",
            obj=locked,
            before=before,
            after=_snapshot(locked, ("name",)),
        )
    return locked


# --- members -----------------------------------------------------------------------------


def _other_owners_exist(tenant: Tenant, membership: Membership) -> bool:
    return (
        Membership.objects.select_for_update()
        .filter(tenant=tenant, role=Role.OWNER)
        .exclude(pk=membership.pk)
        .exists()
    )


def membership_set_role(
    *, tenant: Tenant, actor: Actor, membership: Membership, role: str
) -> Membership:
    if role not in Role.values:
        raise ValidationFailed(f"Role must be one of {', '.join(Role.values)}.", field="role")
    with transaction.atomic():
        locked = Membership.objects.select_for_update().get(pk=membership.pk, tenant=tenant)
        if locked.role == role:
            return locked
        if locked.role == Role.OWNER and not _other_owners_exist(tenant, locked):
            raise ConflictError("A tenant must keep at least one owner.", field="role")
        before = {"role": locked.role}
        locked.role = role
        locked.save(update_fields=["role"])
        audit_record(
            tenant=tenant,
            actor=actor,
            action="membership.role_changed",
            obj=locked,
            before=before,
            after={"role": role},
        )
    return locked


def membership_remove(*, tenant: Tenant, actor: Actor, membership: Membership) -> None:
    with transaction.atomic():
        locked = Membership.objects.select_for_update().get(pk=membership.pk, tenant=tenant)
        if locked.role == Role.OWNER and not _other_owners_exist(tenant, locked):
            raise ConflictError("A tenant must keep at least one owner.", field="role")
        audit_record(
            tenant=tenant,
            actor=actor,
            action="membership.removed",
            obj=locked,
            before={"user": locked.user.get_username(), "role": locked.role},
        )
        locked.delete()


# --- invitations ---------------------------------------------------------------------------


def invitation_accept_url(raw_token: str) -> str:
    return settings.PORTAL_BASE_URL.rstrip("/") + reverse("invitation-accept", args=[raw_token])


def invitation_create(
    *, tenant: Tenant, actor: Actor, email: str, role: str
) -> tuple[Invitation, str]:
    """Invite `email` with `role`; returns the invitation and the raw link token (shown once)."""
    from tenants.tasks import invitation_send_email

    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationFailed("Enter a valid e-mail address.", field="email") from None
    if role not in Role.values:
        raise ValidationFailed(f"Role must be one of {', '.join(Role.values)}.", field="role")
    if Membership.objects.filter(tenant=tenant, user__username=email).exists():
        raise ConflictError("This person is already a member.", field="email")
    raw = INVITATION_PREFIX + secrets.token_urlsafe(32)
    now = timezone.now()
    invitation = Invitation(
        tenant=tenant,
        email=email,
        role=role,
        token_hash=hash_secret(raw),
        invited_by_id=actor.user_id,
        created_at=now,
        expires_at=now + settings.INVITATION_TTL,
    )
    try:
        with transaction.atomic():
            invitation.save()
            audit_record(
                tenant=tenant,
                actor=actor,
                action="invitation.created",
                obj=invitation,
                after={"email": email, "role": role},
            )
            url = invitation_accept_url(raw)
            transaction.on_commit(lambda: invitation_send_email.delay(invitation.pk, url))
    except IntegrityError:
        raise ConflictError("A pending invitation for this e-mail exists.", field="email") from None
    return invitation, raw


def invitation_revoke(*, tenant: Tenant, actor: Actor, invitation: Invitation) -> Invitation:
    with transaction.atomic():
        locked = Invitation.objects.select_for_update().get(pk=invitation.pk, tenant=tenant)
        if locked.status != "pending":
            raise ConflictError(f"The invitation is already {locked.status}.", field="status")
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        audit_record(
            tenant=tenant,
            actor=actor,
            action="invitation.revoked",
            obj=locked,
            before={"status": "pending"},
            after={"status": "revoked"},
        )
    return locked


def invitation_accept(*, user: User, raw_token: str) -> Membership:
    """Turn a pending invitation addressed to `user`'s e-mail into a membership."""
    token_hash = hash_secret(raw_token or "")
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update()
            .select_related("tenant")
            .filter(token_hash=token_hash)
            .first()
        )
        if invitation is None:
            raise ValidationFailed("This invitation link is not valid.", field="token")
        if invitation.status != "pending":
            raise ValidationFailed(f"This invitation is {invitation.status}.", field="token")
        user_email = str(getattr(user, "email", "")).lower()
        if user_email != invitation.email:
            raise ValidationFailed(
                "This invitation is addressed to another e-mail address.", field="token"
            )
        tenant = invitation.tenant
        if Membership.objects.filter(tenant=tenant, user=user).exists():
            raise ConflictError("You are already a member of this tenant.", field="token")
        membership = Membership.objects.create(tenant=tenant, user=user, role=invitation.role)
        invitation.accepted_at = timezone.now()
        invitation.accepted_by = user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
        actor = Actor(user=user)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="invitation.accepted",
            obj=invitation,
            before={"status": "pending"},
            after={"status": "accepted"},
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="membership.created",
            obj=membership,
            after={"user": user.get_username(), "role": membership.role},
        )
    return membership


def invitations_expire(*, now: datetime | None = None) -> int:
    """Mark pending invitations past their expiry as expired; returns how many."""
    now = now or timezone.now()
    expired = 0
    pending = Invitation.objects.filter(
        accepted_at__isnull=True,
        revoked_at__isnull=True,
        expired_at__isnull=True,
        expires_at__lte=now,
    ).select_related("tenant")
    for invitation in pending:
        with transaction.atomic():
            invitation.expired_at = now
            invitation.save(update_fields=["expired_at"])
            audit_record(
                tenant=invitation.tenant,
                actor=Actor(system="invitations_expire"),
                action="invitation.expired",
                obj=invitation,
                before={"status": "pending"},
                after={"status": "expired"},
            )
            expired += 1
    return expired


# --- API tokens ----------------------------------------------------------------------------


def api_token_create(
    *,
    tenant: Tenant,
    actor: Actor,
    name: str,
    scopes: list[str],
    expires_in_days: int | None = None,
    rate_limit_per_second: int | None = None,
) -> tuple[ApiToken, str]:
    """Create a token; the raw value is returned once and only its SHA-256 is stored."""
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("Name is required.", field="name")
    if not scopes:
        raise ValidationFailed("Give at least one scope.", field="scopes")
    unknown = sorted(set(scopes) - set(Scope.values))
    if unknown:
        raise ValidationFailed(f"Unknown scopes: {', '.join(unknown)}.", field="scopes")
    days = settings.API_TOKEN_DEFAULT_DAYS if expires_in_days is None else expires_in_days
    if not 1 <= days <= settings.API_TOKEN_MAX_DAYS:
        raise ValidationFailed(
            f"Expiry must be between 1 and {settings.API_TOKEN_MAX_DAYS} days.",
            field="expires_in_days",
        )
    if rate_limit_per_second is not None and not 1 <= rate_limit_per_second <= TOKEN_RATE_LIMIT_MAX:
        raise ValidationFailed(
            f"Rate limit must be between 1 and {TOKEN_RATE_LIMIT_MAX}.",
            field="rate_limit_per_second",
        )
    secret = secrets.token_urlsafe(32)
    raw = TOKEN_PREFIX + secret
    now = timezone.now()
    token = ApiToken(
        tenant=tenant,
        name=name,
        prefix=raw[: len(TOKEN_PREFIX) + 8],
        token_hash=hash_secret(raw),
        scopes=sorted(set(scopes)),
        expires_at=now + timedelta(days=days),
        rate_limit_per_second=rate_limit_per_second,
        created_by_id=actor.user_id,
        created_at=now,
    )
    if ApiToken.objects.filter(tenant=tenant, name=name, revoked_at__isnull=True).exists():
        raise ConflictError("An active token with this name exists.", field="name")
    try:
        with transaction.atomic():
            token.save()
            audit_record(
                tenant=tenant,
                actor=actor,
                action="api_token.created",
                obj=token,
                after={
                    "name": name,
                    "prefix": token.prefix,
                    "scopes": token.scopes,
                    "expires_at": token.expires_at.isoformat(),
                },
            )
    except IntegrityError:
        raise ConflictError("An active token with this name exists.", field="name") from None
    return token, raw


def api_token_revoke(*, tenant: Tenant, actor: Actor, token: ApiToken) -> ApiToken:
    with transaction.atomic():
        locked = ApiToken.objects.select_for_update().get(pk=token.pk, tenant=tenant)
        if locked.revoked_at is not None:
            return locked
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        # Tell every web process now (fail-safe: a rolled-back revoke still refuses the token).
        ratelimit.set_marker(
            f"token-revoked:{locked.pk}",
            ttl_s=int((locked.expires_at - locked.revoked_at).total_seconds()) + 60,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="api_token.revoked",
            obj=locked,
            before={"status": "active"},
            after={"status": "revoked"},
        )
    return locked


def api_token_touch(*, token: ApiToken, min_interval_s: int = 60) -> None:
    """Record last use, at most once a minute per token (no write on every request)."""
    now = timezone.now()
    if (
        token.last_used_at is not None
        and (now - token.last_used_at).total_seconds() < min_interval_s
    ):
        return
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now


# --- quotas --------------------------------------------------------------------------------


def quota_update(*, tenant: Tenant, actor: Actor, changes: dict[str, int]) -> Quota:
    """Change a tenant's quota; only platform staff may (tenants cannot raise their own)."""
    if not actor.is_platform_staff:
        raise PermissionDeniedError("Only platform staff can change quotas.")
    unknown = sorted(set(changes) - set(QUOTA_FIELDS))
    if unknown:
        raise ValidationFailed(f"Unknown quota field {unknown[0]!r}.", field=unknown[0])
    for name, value in changes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValidationFailed("Must be a non-negative integer.", field=name)
    with transaction.atomic():
        quota = Quota.objects.select_for_update().get(tenant=tenant)
        before = _snapshot(quota, QUOTA_FIELDS)
        for name, value in changes.items():
            setattr(quota, name, value)
        quota.updated_at = timezone.now()
        quota.full_clean()
        quota.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="quota.updated",
            obj=quota,
            before=before,
            after=_snapshot(quota, QUOTA_FIELDS),
        )
        transaction.on_commit(lambda: cache.delete(f"quota-rps:{tenant.pk}"))
    return quota
