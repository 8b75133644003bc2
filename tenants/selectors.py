"""Reads of the tenants room; every selector takes the tenant explicitly."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import OuterRef, QuerySet, Subquery

from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Quota, Tenant
from tenants.services import hash_secret


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

    One query: the tenant is joined and the quota's requests_per_second is annotated as
    `tenant_rps`, so the request path needs nothing else from PostgreSQL.
    """
    rps = Quota.objects.filter(tenant=OuterRef("tenant")).values("requests_per_second")[:1]
    try:
        return (
            ApiToken.objects.select_related("tenant")
            .annotate(tenant_rps=Subquery(rps))
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
