"""API tokens: `api_token_create` (the raw value is returned once, only its SHA-256 is
stored), `api_token_revoke`, `revoke_locked_token` (the revocation step that offboarding
shares, inside the caller's transaction) and `api_token_touch` (last use, throttled)."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal import ratelimit
from portal.exceptions import ConflictError, ValidationFailed
from tenants.actors import Actor
from tenants.models import ApiToken, Scope, Tenant
from tenants.secrets import TOKEN_PREFIX, hash_secret
from tenants.services.audit import acting_member_id, audit_record

TOKEN_RATE_LIMIT_MAX = 2**31 - 1  # what the column (PositiveIntegerField) holds


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
        created_by_id=acting_member_id(actor=actor),
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


def revoke_locked_token(
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
        revoke_locked_token(tenant=tenant, actor=actor, token=locked)
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
