"""All writes of the tenants room: onboarding, members, invitations, tokens, quotas, audit."""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import User
from django.core import signing
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, models, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django.utils.text import slugify

from portal import ratelimit
from portal.exceptions import ConflictError, PermissionDeniedError, ValidationFailed
from tenants.actors import Actor
from tenants.models import (
    ROLE_SCOPES,
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
SIGNUP_MODES = ("open", "verify", "closed")
SIGNUP_VERIFY_SALT = "tenants.signup-verify"
MEMBER_REMOVED_EVENT = "membership.removed"
logger = logging.getLogger(__name__)


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


def max_tenants_per_user() -> int:
    return int(getattr(settings, "MAX_TENANTS_PER_USER", 3))


def _check_tenant_allowance(owner: User) -> None:
    """Each tenant comes with fresh quotas, so a user owns at most MAX_TENANTS_PER_USER
    (platform staff exempt). The user row is locked: two parallel creates cannot both pass."""
    if owner.is_staff:
        return
    get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
    limit = max_tenants_per_user()
    if Membership.objects.filter(user=owner, role=Role.OWNER).count() >= limit:
        raise ValidationFailed(
            f"You already own {limit} tenant{'s' if limit != 1 else ''}, the most one account "
            "may own. Ask platform staff for more, or remove one you no longer use.",
            field="name",
        )


def tenant_create(*, owner: User, name: str, actor: Actor, plan: str = Plan.FREE) -> Tenant:
    """Create a tenant with `owner` as its first owner and the plan's default quotas."""
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("Organisation name is required.", field="name")
    if plan not in PLAN_QUOTAS:
        raise ValidationFailed(f"Unknown plan {plan!r}.", field="plan")
    with transaction.atomic():
        _check_tenant_allowance(owner)
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


def signup_mode() -> str:
    """SIGNUP_MODE: "open" (sign up and in at once), "verify" (the account stays inactive
    until the e-mailed link is followed) or "closed" (no self-service signup)."""
    mode = str(getattr(settings, "SIGNUP_MODE", "open")).strip().lower()
    return mode if mode in SIGNUP_MODES else "closed"  # a typo must not open the door


def signup(*, email: str, password: str, organisation: str) -> tuple[User, Tenant]:
    """Self-service onboarding: a new user and a new tenant they own, atomically.

    In "verify" mode the user is created inactive and a verification link is e-mailed after
    commit; `user.is_active` tells the caller which happened.
    """
    mode = signup_mode()
    if mode == "closed":
        raise PermissionDeniedError("Signup is closed on this portal; ask for an invitation.")
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
    try:
        with transaction.atomic():
            user = user_model.objects.create_user(
                username=email, email=email, password=password, is_active=mode != "verify"
            )
            tenant = tenant_create(owner=user, name=organisation, actor=Actor(user=user))
            if not user.is_active:
                _send_verification_on_commit(user)
    except IntegrityError:  # a parallel signup with the same e-mail won the race
        raise ValidationFailed(
            "An account with this e-mail already exists.", field="email"
        ) from None
    except ValidationFailed as exc:
        if exc.field == "name":  # the signup form calls the tenant's name "organisation"
            raise ValidationFailed(exc.message, field="organisation") from None
        raise
    return user, tenant


def _verification_fingerprint(user: User) -> str:
    """Changes once the account is activated (or its password or e-mail changes): a link
    works once, and never reactivates an account that staff deactivated after it was used."""
    state = f"{user.pk}:{user.password}:{user.email}:{user.is_active}:{user.last_login}"
    return salted_hmac(SIGNUP_VERIFY_SALT, state).hexdigest()[:20]


def signup_verification_url(user: User) -> str:
    token = signing.dumps(
        {"u": user.pk, "f": _verification_fingerprint(user)}, salt=SIGNUP_VERIFY_SALT
    )
    return settings.PORTAL_BASE_URL.rstrip("/") + reverse("signup-verify", args=[token])


def _send_verification_on_commit(user: User) -> None:
    from tenants.tasks import signup_send_verification

    url = signup_verification_url(user)
    user_id = user.pk
    transaction.on_commit(lambda: signup_send_verification.delay(user_id, url))


def signup_verify_ttl_hours() -> int:
    return max(1, int(getattr(settings, "SIGNUP_VERIFY_TTL_HOURS", 48)))


def signup_verify(*, token: str) -> User:
    """Activate the account a verification link names; refuses tampered and expired links."""
    ttl_s = signup_verify_ttl_hours() * 3600
    try:
        data = signing.loads(token or "", salt=SIGNUP_VERIFY_SALT, max_age=ttl_s)
    except signing.SignatureExpired:
        raise ValidationFailed(
            "This verification link has expired; sign up again.", field="token"
        ) from None
    except signing.BadSignature:
        raise ValidationFailed("This verification link is not valid.", field="token") from None
    user_id = data.get("u") if isinstance(data, dict) else None
    with transaction.atomic():
        user = (
            get_user_model().objects.select_for_update().filter(pk=user_id).first()
            if isinstance(user_id, int)
            else None
        )
        if user is None or not secrets.compare_digest(
            str(data.get("f", "")), _verification_fingerprint(user)
        ):
            raise ValidationFailed("This verification link is not valid.", field="token")
        user.is_active = True
        user.save(update_fields=["is_active"])
        for membership in Membership.objects.filter(user=user).select_related("tenant"):
            audit_record(
                tenant=membership.tenant,
                actor=Actor(user=user),
                action="user.verified",
                obj=membership,
                after={"user": user.get_username(), "is_active": True},
            )
    return user


# --- sign-in and signup throttles -----------------------------------------------------------


def client_ip(meta: dict[str, Any]) -> str:
    """The peer address (the proxy in front sets REMOTE_ADDR; no client header is trusted)."""
    return str(meta.get("REMOTE_ADDR") or "unknown")[:64]


def _throttle_bucket(kind: str, subject: str, limit_setting: str, default: int) -> ratelimit.Bucket:
    limit = max(1, int(getattr(settings, limit_setting, default)))
    window_s = max(1, int(getattr(settings, "AUTH_THROTTLE_WINDOW_S", 300)))
    digest = hashlib.sha256(subject.encode()).hexdigest()[:32]  # no e-mail in Redis keys
    return ratelimit.Bucket(f"{kind}:{digest}", limit / window_s, burst=limit)


def login_throttle(*, email: str, ip: str) -> float:
    """Charge one sign-in attempt per (normalised) e-mail and per client IP, before any
    password is checked; seconds to wait when either is spent, else 0."""
    buckets = [_throttle_bucket("login-ip", ip, "LOGIN_THROTTLE_PER_IP", 50)]
    email = (email or "").strip().lower()
    if email:
        buckets.append(_throttle_bucket("login-email", email, "LOGIN_THROTTLE_PER_EMAIL", 10))
    return ratelimit.throttle(buckets)


def signup_throttle(*, ip: str) -> float:
    """Charge one signup attempt per client IP; seconds to wait when spent, else 0."""
    return ratelimit.throttle([_throttle_bucket("signup-ip", ip, "SIGNUP_THROTTLE_PER_IP", 10)])


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


def tenant_set_suspended(
    *, tenant: Tenant, actor: Actor, suspended: bool, reason: str = ""
) -> Tenant:
    """Suspend (or reinstate) a tenant: platform staff only. Its pages, API and tokens refuse
    at once; after commit its routers are reconciled to refuse its traffic (403
    tenant_suspended), its drill runs abort at their next step, its notifications stop."""
    from tenants.signals import tenant_suspension_changed

    if not actor.is_platform_staff:
        raise PermissionDeniedError("Only platform staff can suspend a tenant.", field="is_active")
    reason = " ".join((reason or "").split())[:500]
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if locked.is_active == (not suspended):
            return locked
        locked.is_active = not suspended
        locked.save(update_fields=["is_active"])
        if suspended:
            # Tokens cached in other processes carry the tenant as it was: deny them until
            # every cache entry made before now has expired (a cold load sees the suspension).
            ttl = int(getattr(settings, "API_TOKEN_CACHE_SECONDS", 10)) + 5
            active = ApiToken.objects.filter(tenant=locked, revoked_at__isnull=True)
            for token_id in active.values_list("pk", flat=True):
                ratelimit.set_marker(f"token-revoked:{token_id}", ttl_s=ttl)
        audit_record(
            tenant=locked,
            actor=actor,
            action="tenant.suspended" if suspended else "tenant.reinstated",
            obj=locked,
            before={"is_active": suspended},
            after={"is_active": not suspended, "reason": reason},
        )

        def tell() -> None:
            tenant_suspension_changed.send(sender=Tenant, tenant=locked, suspended=suspended)

        transaction.on_commit(tell)
    return locked


# --- members -----------------------------------------------------------------------------


def _other_owners_exist(tenant: Tenant, membership: Membership) -> bool:
    return (
        Membership.objects.select_for_update()
        .filter(tenant=tenant, role=Role.OWNER)
        .exclude(pk=membership.pk)
        .exists()
    )


def member_group(tenant_id: int, user_id: int) -> str:
    """The Channels group every tenant-scoped socket of one member joins (to be closed)."""
    return f"tenant-{tenant_id}.user-{user_id}"


def _close_member_sockets_on_commit(tenant_id: int, user_id: int) -> None:
    """After commit, tell the member's open sockets in this tenant to close (4403)."""
    group = member_group(tenant_id, user_id)

    def send() -> None:
        from channels.layers import get_channel_layer

        try:
            layer = get_channel_layer()
            if layer is not None:
                async_to_sync(layer.group_send)(group, {"type": MEMBER_REMOVED_EVENT})
        except Exception as exc:  # the removal stands; pages and tokens refuse already
            logger.warning("member sockets of %s not told to close: %s", group, exc)

    transaction.on_commit(send)


def _offboard_tokens(
    *, tenant: Tenant, actor: Actor, user_id: int, allowed: frozenset[str] | None, reason: str
) -> int:
    """Revoke (allowed None) or narrow to `allowed` the active tokens `user_id` created here;
    a token left with no scope is revoked. Returns how many changed. Caller holds the atomic."""
    changed = 0
    now = timezone.now()
    tokens = ApiToken.objects.select_for_update().filter(
        tenant=tenant, created_by_id=user_id, revoked_at__isnull=True, expires_at__gt=now
    )
    for token in tokens.order_by("pk"):
        narrowed = sorted(set(token.scopes) & allowed) if allowed is not None else []
        if narrowed == sorted(token.scopes):
            continue
        changed += 1
        if not narrowed:
            _revoke_locked_token(tenant=tenant, actor=actor, token=token, reason=reason)
            continue
        before = {"scopes": token.scopes}
        token.scopes = narrowed
        token.save(update_fields=["scopes"])
        # Every process's token cache sees it on the next request (tenants.auth); a rolled
        # back demotion leaves the token narrower than its row, which fails safe.
        from tenants.auth import scopes_marker

        ratelimit.set_value(
            scopes_marker(token.pk),
            ",".join(narrowed),
            ttl_s=int((token.expires_at - now).total_seconds()) + 60,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="api_token.scopes_narrowed",
            obj=token,
            before=before,
            after={"scopes": narrowed, "reason": reason},
        )
    return changed


def _offboard_invitations(*, tenant: Tenant, actor: Actor, user_id: int, reason: str) -> int:
    """Revoke the pending invitations `user_id` issued here. Caller holds the atomic."""
    now = timezone.now()
    pending = Invitation.objects.select_for_update().filter(
        tenant=tenant,
        invited_by_id=user_id,
        accepted_at__isnull=True,
        revoked_at__isnull=True,
        expired_at__isnull=True,
        expires_at__gt=now,
    )
    count = 0
    for invitation in pending.order_by("pk"):
        invitation.revoked_at = now
        invitation.save(update_fields=["revoked_at"])
        audit_record(
            tenant=tenant,
            actor=actor,
            action="invitation.revoked",
            obj=invitation,
            before={"status": "pending"},
            after={"status": "revoked", "reason": reason},
        )
        count += 1
    return count


def membership_set_role(
    *, tenant: Tenant, actor: Actor, membership: Membership, role: str
) -> Membership:
    """Change a member's role. A demotion narrows the tokens they created to the new role's
    scopes at once, and one that takes `admin` away revokes the invitations they issued (an
    invitation is the admin acting later). A promotion widens no token."""
    if role not in Role.values:
        raise ValidationFailed(f"Role must be one of {', '.join(Role.values)}.", field="role")
    with transaction.atomic():
        locked = Membership.objects.select_for_update().get(pk=membership.pk, tenant=tenant)
        if locked.role == role:
            return locked
        if locked.role == Role.OWNER and not _other_owners_exist(tenant, locked):
            raise ConflictError("A tenant must keep at least one owner.", field="role")
        before = {"role": locked.role}
        old_scopes = ROLE_SCOPES[locked.role]
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
        new_scopes = ROLE_SCOPES[role]
        if not old_scopes <= new_scopes:
            reason = f"creator demoted to {role}"
            _offboard_tokens(
                tenant=tenant, actor=actor, user_id=locked.user_id, allowed=new_scopes,
                reason=reason,
            )  # fmt: skip
            if Scope.ADMIN not in new_scopes:
                _offboard_invitations(
                    tenant=tenant, actor=actor, user_id=locked.user_id, reason=reason
                )
    return locked


def membership_remove(*, tenant: Tenant, actor: Actor, membership: Membership) -> dict[str, int]:
    """Remove a member and everything that still acts for them here: the tokens they created
    are revoked, the invitations they issued are revoked, and their open sockets of this
    tenant are closed (4403) once the removal commits. Returns how many tokens and
    invitations it revoked."""
    with transaction.atomic():
        locked = (
            Membership.objects.select_for_update()
            .select_related("user")
            .get(pk=membership.pk, tenant=tenant)
        )
        if locked.role == Role.OWNER and not _other_owners_exist(tenant, locked):
            raise ConflictError("A tenant must keep at least one owner.", field="role")
        reason = "creator removed from the tenant"
        tokens = _offboard_tokens(
            tenant=tenant, actor=actor, user_id=locked.user_id, allowed=None, reason=reason
        )
        invitations = _offboard_invitations(
            tenant=tenant, actor=actor, user_id=locked.user_id, reason=reason
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="membership.removed",
            obj=locked,
            before={"user": locked.user.get_username(), "role": locked.role},
            after={"tokens_revoked": tokens, "invitations_revoked": invitations},
        )
        _close_member_sockets_on_commit(tenant.pk, locked.user_id)
        locked.delete()
    return {"tokens": tokens, "invitations": invitations}


# --- invitations ---------------------------------------------------------------------------


def _acting_member_id(actor: Actor) -> int | None:
    """The member behind an action: the user, or the member who created the acting token, so
    what a member's automation creates is offboarded with them."""
    if actor.user_id is not None:
        return actor.user_id
    return actor.token.created_by_id if actor.token is not None else None


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
        invited_by_id=_acting_member_id(actor),
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
        if invitation.invited_by_id is not None:
            inviter = Membership.objects.filter(tenant=tenant, user_id=invitation.invited_by_id)
            role = inviter.values_list("role", flat=True).first()
            if role is None or Scope.ADMIN not in ROLE_SCOPES[role]:
                raise ValidationFailed(
                    "The member who sent this invitation can no longer invite; ask an owner "
                    "for a new one.",
                    field="token",
                )
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
        created_by_id=_acting_member_id(actor),
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


def _revoke_locked_token(
    *, tenant: Tenant, actor: Actor, token: ApiToken, reason: str | None = None
) -> None:
    """Revoke a row the caller locked, inside the caller's transaction."""
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    # Tell every web process now (fail-safe: a rolled-back revoke still refuses the token).
    ratelimit.set_marker(
        f"token-revoked:{token.pk}",
        ttl_s=int((token.expires_at - token.revoked_at).total_seconds()) + 60,
    )
    after: dict[str, Any] = {"status": "revoked"}
    if reason:
        after["reason"] = reason
    audit_record(
        tenant=tenant,
        actor=actor,
        action="api_token.revoked",
        obj=token,
        before={"status": "active"},
        after=after,
    )


def api_token_revoke(*, tenant: Tenant, actor: Actor, token: ApiToken) -> ApiToken:
    with transaction.atomic():
        locked = ApiToken.objects.select_for_update().get(pk=token.pk, tenant=tenant)
        if locked.revoked_at is not None:
            return locked
        _revoke_locked_token(tenant=tenant, actor=actor, token=locked)
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
