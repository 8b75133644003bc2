"""API token authentication: `Authorization: Bearer aop_...`, checked against the stored hash."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from tenants import selectors, services


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
        raw = header[1]
        if not raw.startswith(services.TOKEN_PREFIX):
            raise exceptions.AuthenticationFailed("Unknown token format.")
        token = selectors.api_token_find(raw_token=raw)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
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
