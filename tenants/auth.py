"""API token authentication: `Authorization: Bearer aop_...`, checked against the stored hash."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from django.conf import settings
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from portal import ratelimit
from tenants import selectors, services
from tenants.models import ROLE_SCOPES, ApiToken, Scope
from tenants.secrets import TOKEN_PREFIX, hash_secret


class TokenCache:
    """A small per-process LRU of authenticated tokens, fresh for API_TOKEN_CACHE_SECONDS.

    It keeps PostgreSQL off the API hot path. Revocation does not wait for it to expire: every
    request also checks the token's revocation marker in Redis, in the same round trip as the
    rate limit (tenants.api.base), so a revoked token is refused by every process at once; a
    demotion of its creator publishes the narrowed scopes (`scopes_marker`), read before the
    scope check.
    """

    def __init__(self, size: int = 10_000) -> None:
        self._items: OrderedDict[str, tuple[float, ApiToken]] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, token_hash: str) -> ApiToken | None:
        with self._lock:
            item = self._items.get(token_hash)
            if item is None:
                return None
            if time.monotonic() - item[0] > settings.API_TOKEN_CACHE_SECONDS:
                del self._items[token_hash]
                return None
            self._items.move_to_end(token_hash)
            return item[1]

    def put(self, token_hash: str, token: ApiToken) -> None:
        with self._lock:
            self._items[token_hash] = (time.monotonic(), token)
            self._items.move_to_end(token_hash)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


token_cache = TokenCache()


def revocation_marker(token: ApiToken) -> str:
    return f"token-revoked:{token.pk}"


def scopes_marker(token_id: int) -> str:
    """Redis key holding a token's narrowed scopes (set when its creator is demoted)."""
    return f"token-scopes:{token_id}"


def _creator_left(token: ApiToken) -> bool:
    """The member who created the token is no longer in its tenant (read on a cache miss)."""
    return token.created_by_id is not None and getattr(token, "creator_role", "") is None


def _cap_to_creator(token: ApiToken) -> None:
    """A token never does more than the role of the member who made it holds now."""
    role = getattr(token, "creator_role", None)
    if role in ROLE_SCOPES:
        token.scopes = sorted(set(token.scopes) & ROLE_SCOPES[role])


def _apply_narrowing(token: ApiToken) -> None:
    """Warm path: a demotion in any process narrows this process's cached token at once.

    One Redis GET, only for tokens a demotion can still narrow (a member's token with more
    than `read`); none for read-only ones. Under leases (fast buckets) the reply is reused for
    RATE_LIMIT_LEASE_MS, the same bound as a revocation made in another process.
    """
    if token.created_by_id is None or set(token.scopes) <= {Scope.READ}:
        return
    leased = ratelimit.rates_are_leased(
        getattr(token, "tenant_rps", None),
        *([token.rate_limit_per_second] if token.rate_limit_per_second else []),
    )
    value = ratelimit.get_value(
        scopes_marker(token.pk), memo_ms=settings.RATE_LIMIT_LEASE_MS if leased else 0
    )
    if value is not None:
        allowed = set(value.split(",")) if value else set()
        token.scopes = sorted(set(token.scopes) & allowed)


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
        raw = header[1]
        if not raw.startswith(TOKEN_PREFIX):
            raise exceptions.AuthenticationFailed("Unknown token format.")
        token_hash = hash_secret(raw)
        token = token_cache.get(token_hash)
        if token is None:
            token = selectors.api_token_find(token_hash=token_hash)
            if token is None:
                raise exceptions.AuthenticationFailed("Invalid token.")
            _cap_to_creator(token)
            token_cache.put(token_hash, token)
        if _creator_left(token):
            raise exceptions.AuthenticationFailed(
                "The member who created this token has left the tenant."
            )
        _apply_narrowing(token)
        if not token.scopes:
            raise exceptions.AuthenticationFailed("This token has no scopes left.")
        if token.status == "revoked":
            raise exceptions.AuthenticationFailed("This token has been revoked.")
        if token.status == "expired":
            raise exceptions.AuthenticationFailed("This token has expired.")
        if not token.tenant.is_active:
            raise exceptions.AuthenticationFailed("This tenant is suspended.")
        services.api_token_touch(token=token)
        return (TokenUser(token), token)

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class TokenUser:
    """The request user for token requests: authenticated, bound to one tenant, never staff."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, token: Any) -> None:
        self.token = token
        self.pk = None
        self.id = None

    def get_username(self) -> str:
        return f"token:{self.token.prefix}"

    def __str__(self) -> str:
        return self.get_username()


try:
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    class ApiTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
        target_class = "tenants.auth.ApiTokenAuthentication"
        name = "bearerAuth"

        def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
            return {"type": "http", "scheme": "bearer", "bearerFormat": "aop_*"}

except ImportError:  # pragma: no cover  (drf-spectacular is a runtime dependency)
    pass
