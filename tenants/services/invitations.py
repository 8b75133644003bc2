"""Invitations: `invitation_create` (the raw link token is returned once and e-mailed after
commit), `invitation_revoke`, `invitation_accept` (a pending invitation addressed to the
user's e-mail becomes a membership) and `invitations_expire` (the periodic sweep)."""

from __future__ import annotations

import secrets
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.exceptions import ConflictError, ValidationFailed
from tenants.actors import Actor
from tenants.links import invitation_accept_url
from tenants.models import ROLE_SCOPES, Invitation, Membership, Role, Scope, Tenant
from tenants.secrets import INVITATION_PREFIX, hash_secret
from tenants.services.audit import acting_member_id, audit_record


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
        invited_by_id=acting_member_id(actor=actor),
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
