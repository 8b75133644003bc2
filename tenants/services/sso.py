"""Single sign-on's writes: the account an OIDC sign-in names (found or created by its
verified e-mail) and the memberships the provider's groups grant, reconciled on every
sign-in through OIDC_GROUP_ROLES. Memberships granted in the portal (signup, a new tenant,
an invitation: source `local`) are never touched here; only `oidc` ones follow the groups."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Q

from portal.exceptions import ConflictError, PermissionDeniedError, PortalError, ValidationFailed
from tenants.actors import Actor
from tenants.models import Membership, MembershipSource, Role, Tenant
from tenants.services.audit import audit_record
from tenants.services.members import membership_remove, membership_set_role

logger = logging.getLogger(__name__)

SSO_ACTOR = Actor(system="oidc")
ROLE_RANK: dict[str, int] = {Role.VIEWER.value: 0, Role.OPERATOR.value: 1, Role.OWNER.value: 2}


@dataclass
class MembershipSync:
    """What one reconcile did, by tenant slug."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # a change refused (the tenant's last owner)
    ignored: list[str] = field(default_factory=list)  # a group names no existing tenant


def oidc_roles_for_groups(*, groups: Sequence[str]) -> dict[str, tuple[str, list[str]]]:
    """Tenant slug -> (role, the groups that grant it) for the groups OIDC_GROUP_ROLES maps;
    two groups naming one tenant grant the higher role."""
    mapping: dict[str, dict[str, str]] = settings.OIDC_GROUP_ROLES
    wanted: dict[str, tuple[str, list[str]]] = {}
    for group in sorted(set(groups)):
        grant = mapping.get(group)
        if grant is None:
            continue
        slug, role = grant["tenant"], grant["role"]
        if role not in ROLE_RANK:  # settings check it at startup; a hand-edited value still
            logger.warning("OIDC group %r maps to unknown role %r: ignored", group, role)
            continue
        best, via = wanted.get(slug, (role, []))
        wanted[slug] = (role if ROLE_RANK[role] > ROLE_RANK[best] else best, [*via, group])
    return wanted


def _refused(*, tenant: Tenant, membership: Membership, wanted: str, exc: PortalError) -> None:
    logger.warning(
        "OIDC groups of %s would leave %s without an owner (%s): the membership is kept",
        membership.user_id,
        tenant.slug,
        wanted,
    )
    audit_record(
        tenant=tenant,
        actor=SSO_ACTOR,
        action="membership.sso_change_refused",
        obj=membership,
        before={"role": membership.role},
        after={"wanted": wanted, "reason": exc.message},
    )


def oidc_memberships_sync(*, user: User, groups: Sequence[str]) -> MembershipSync:
    """Make the user's `oidc` memberships match their groups: add the missing ones, change
    roles, remove those no group grants any more. A group naming a tenant that does not
    exist is ignored and logged (never creates one); a `local` membership wins over a group;
    a change that would leave a tenant without an owner is refused, kept and audited."""
    wanted = oidc_roles_for_groups(groups=groups)
    report = MembershipSync()
    with transaction.atomic():
        tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=list(wanted))}
        for slug in sorted(set(wanted) - set(tenants)):
            logger.warning(
                "OIDC groups %s of %s name the tenant %r, which does not exist: ignored",
                wanted[slug][1],
                user.get_username(),
                slug,
            )
            report.ignored.append(slug)
        current = {
            m.tenant_id: m
            for m in Membership.objects.select_for_update()
            .filter(user=user)
            .select_related("tenant")
            .order_by("pk")
        }
        for slug, tenant in sorted(tenants.items()):
            role, via = wanted[slug]
            membership = current.get(tenant.pk)
            if membership is None:
                membership = Membership(
                    tenant=tenant, user=user, role=role, source=MembershipSource.OIDC
                )
                membership.full_clean()
                membership.save()
                audit_record(
                    tenant=tenant,
                    actor=SSO_ACTOR,
                    action="membership.created",
                    obj=membership,
                    after={"user": user.get_username(), "role": role, "groups": via},
                )
                report.added.append(slug)
            elif membership.source == MembershipSource.OIDC and membership.role != role:
                try:
                    membership_set_role(
                        tenant=tenant, actor=SSO_ACTOR, membership=membership, role=role
                    )
                except ConflictError as exc:
                    _refused(tenant=tenant, membership=membership, wanted=role, exc=exc)
                    report.kept.append(slug)
                else:
                    report.changed.append(slug)
        for membership in current.values():
            if membership.source != MembershipSource.OIDC or membership.tenant.slug in tenants:
                continue
            try:
                membership_remove(tenant=membership.tenant, actor=SSO_ACTOR, membership=membership)
            except ConflictError as exc:
                _refused(tenant=membership.tenant, membership=membership, wanted="none", exc=exc)
                report.kept.append(membership.tenant.slug)
            else:
                report.removed.append(membership.tenant.slug)
    return report


def oidc_user_sign_in(
    *, email: str, groups: Sequence[str], first_name: str = "", last_name: str = ""
) -> User:
    """The account a verified OIDC identity names, found by e-mail or created (no usable
    password: it signs in through the provider), with its memberships reconciled. Refuses a
    disabled account and an e-mail two accounts share."""
    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationFailed(
            "The identity provider sent no valid e-mail address.", field="email"
        ) from None
    try:
        return _sign_in(
            email=email, groups=groups, first_name=first_name[:150], last_name=last_name[:150]
        )
    except IntegrityError:  # a parallel first sign-in of the same person won the race
        raise ConflictError(
            "Another sign-in of this account is under way; try again.", field="email"
        ) from None


def _sign_in(*, email: str, groups: Sequence[str], first_name: str, last_name: str) -> User:
    user_model = get_user_model()
    with transaction.atomic():
        found = list(
            user_model.objects.select_for_update()
            .filter(Q(email__iexact=email) | Q(username__iexact=email))
            .order_by("pk")[:2]
        )
        if len(found) > 1:
            raise ConflictError(
                f"More than one account uses {email}; ask platform staff to merge them.",
                field="email",
            )
        if found:
            user = found[0]
            if not user.is_active:
                raise PermissionDeniedError(
                    f"The account {email} is disabled on this portal.", field="email"
                )
            names = {"first_name": first_name, "last_name": last_name}
            changed = [k for k, v in names.items() if v and getattr(user, k) != v]
            for name in changed:
                setattr(user, name, names[name])
            if changed:
                user.save(update_fields=changed)
        else:
            user = user_model(
                username=email, email=email, first_name=first_name, last_name=last_name
            )
            user.set_unusable_password()
            try:
                user.full_clean()
            except ValidationError as exc:
                raise ValidationFailed(
                    f"No account can be made for {email}: {' '.join(exc.messages)}", field="email"
                ) from None
            user.save()
        oidc_memberships_sync(user=user, groups=groups)
    return user
