"""Tenants and onboarding: `tenant_create` (with its owner, quotas and the per-user tenant
allowance), self-service `signup` and its e-mailed verification (`signup_verify`), the
SIGNUP_MODE switch, `tenant_update` and the staff-only `tenant_set_suspended`."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import User
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from portal import ratelimit
from portal.exceptions import PermissionDeniedError, ValidationFailed
from tenants.actors import Actor
from tenants.links import SIGNUP_VERIFY_SALT, signup_verification_url, verification_fingerprint
from tenants.models import ApiToken, Membership, Plan, Quota, Role, Tenant
from tenants.services.audit import audit_record, snapshot
from tenants.services.quotas import PLAN_QUOTAS

SIGNUP_MODES = ("open", "verify", "closed")


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
            after=snapshot(obj=tenant, fields=("slug", "name", "plan")),
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
            str(data.get("f", "")), verification_fingerprint(user)
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


def tenant_update(*, tenant: Tenant, actor: Actor, name: str) -> Tenant:
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("Name must not be empty.", field="name")
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        before = snapshot(obj=locked, fields=("name",))
        locked.name = name
        locked.full_clean()
        locked.save(update_fields=["name"])
        audit_record(
            tenant=locked,
            actor=actor,
            action="tenant.updated",
            obj=locked,
            before=before,
            after=snapshot(obj=locked, fields=("name",)),
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
