"""Reads of the tenants room; every selector takes the tenant explicitly."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.utils import timezone

from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Quota, Role, Tenant
from tenants.secrets import hash_secret


def tenant_list_for_user(*, user: User | AnonymousUser) -> QuerySet[Tenant]:
    if not isinstance(user, User):
        return Tenant.objects.none()
    return Tenant.objects.filter(tenants_membership_set__user=user, is_active=True).order_by("slug")


def membership_get(*, tenant: Tenant, user: User | AnonymousUser) -> Membership | None:
    if not isinstance(user, User):
        return None
    return Membership.objects.filter(tenant=tenant, user=user).select_related("tenant").first()


def memberships_of_user(*, user: User | AnonymousUser) -> QuerySet[Membership]:
    if not isinstance(user, User):
        return Membership.objects.none()
    return (
        Membership.objects.filter(user=user, tenant__is_active=True)
        .select_related("tenant")
        .order_by("tenant__slug")
    )


def membership_list(*, tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.filter(tenant=tenant).select_related("user").order_by("id")


def invitation_list(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.filter(tenant=tenant).select_related("invited_by")


def membership_offboarding_counts(*, tenant: Tenant) -> dict[int, dict[str, int]]:
    """Per member (user id): the active tokens and pending invitations removing them revokes.

    Two grouped queries for the whole members page, whatever its length.
    """
    now = timezone.now()
    counts: dict[int, dict[str, int]] = {}
    tokens = (
        ApiToken.objects.filter(
            tenant=tenant,
            created_by__isnull=False,
            revoked_at__isnull=True,
            expires_at__gt=now,
        )
        .values("created_by")
        .annotate(n=Count("id"))
    )
    for row in tokens:
        counts.setdefault(row["created_by"], {"tokens": 0, "invitations": 0})["tokens"] = row["n"]
    invitations = (
        pending_invitations(tenant=tenant, now=now)
        .filter(invited_by__isnull=False)
        .values("invited_by")
        .annotate(n=Count("id"))
    )
    for invited in invitations:
        entry = counts.setdefault(invited["invited_by"], {"tokens": 0, "invitations": 0})
        entry["invitations"] = invited["n"]
    return counts


def pending_invitations(*, tenant: Tenant, now: datetime | None = None) -> QuerySet[Invitation]:
    return Invitation.objects.filter(
        tenant=tenant,
        accepted_at__isnull=True,
        revoked_at__isnull=True,
        expired_at__isnull=True,
        expires_at__gt=now or timezone.now(),
    )


def active_tokens_of(*, tenant: Tenant, user_id: int) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(
        tenant=tenant, created_by_id=user_id, revoked_at__isnull=True, expires_at__gt=timezone.now()
    )


def owned_tenant_count(*, user_id: int) -> int:
    """Tenants `user_id` owns (suspended ones included: suspension must not free a slot)."""
    return Membership.objects.filter(user_id=user_id, role=Role.OWNER).count()


def invitation_get_by_token(*, raw_token: str) -> Invitation | None:
    return (
        Invitation.objects.filter(token_hash=hash_secret(raw_token or ""))
        .select_related("tenant")
        .first()
    )


def api_token_list(*, tenant: Tenant) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(tenant=tenant).select_related("created_by")


def api_token_find(*, token_hash: str) -> ApiToken | None:
    """The token with this hash (whatever its status), its tenant, and the tenant's API rate.

    One query: the tenant is joined, the quota's requests_per_second is annotated as
    `tenant_rps` and the creator's current role in the tenant as `creator_role` (None when
    they left), so the request path needs nothing else from PostgreSQL.
    """
    rps = Quota.objects.filter(tenant=OuterRef("tenant")).values("requests_per_second")[:1]
    role = Membership.objects.filter(tenant=OuterRef("tenant"), user=OuterRef("created_by"))
    try:
        return (
            ApiToken.objects.select_related("tenant")
            .annotate(tenant_rps=Subquery(rps), creator_role=Subquery(role.values("role")[:1]))
            .get(token_hash=token_hash)
        )
    except ApiToken.DoesNotExist:
        return None


def quota_get(*, tenant: Tenant) -> Quota:
    return Quota.objects.get(tenant=tenant)


def audit_event_list(*, tenant: Tenant) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(tenant=tenant)


def quota_get_cached(*, tenant: Tenant, ttl_s: int = 5) -> float:
    """Requests per second allowed for `tenant`, cached briefly (read on every API request)."""
    from django.core.cache import cache

    key = f"quota-rps:{tenant.pk}"
    value = cache.get(key)
    if value is None:
        value = Quota.objects.filter(tenant=tenant).values_list("requests_per_second", flat=True)
        value = float(value.first() or 0)
        cache.set(key, value, ttl_s)
    return float(value)
