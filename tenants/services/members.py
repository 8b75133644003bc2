"""Members: `membership_set_role` and `membership_remove`, with the offboarding they carry
out in the same transaction (the member's tokens narrowed or revoked, the invitations they
issued revoked) and, after commit, the close (4403) of their open sockets of the tenant."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from portal import ratelimit
from portal.exceptions import ConflictError, ValidationFailed
from tenants.actors import Actor
from tenants.channels import member_group
from tenants.models import ROLE_SCOPES, ApiToken, Invitation, Membership, Role, Scope, Tenant
from tenants.services.audit import audit_record
from tenants.services.tokens import revoke_locked_token

MEMBER_REMOVED_EVENT = "membership.removed"
logger = logging.getLogger(__name__)


def _other_owners_exist(tenant: Tenant, membership: Membership) -> bool:
    return (
        Membership.objects.select_for_update()
        .filter(tenant=tenant, role=Role.OWNER)
        .exclude(pk=membership.pk)
        .exists()
    )


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
            revoke_locked_token(tenant=tenant, actor=actor, token=token, reason=reason)
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
                tenant=tenant,
                actor=actor,
                user_id=locked.user_id,
                allowed=new_scopes,
                reason=reason,
            )
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
