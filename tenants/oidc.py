"""OpenID Connect sign-in beside passwords (mozilla-django-oidc): the provider's endpoints
(from OIDC_OP_DISCOVERY_URL, fetched once per process, or set one by one), the views that
start and finish the authorization-code flow (state, nonce, PKCE), and the backend that
checks the ID token (RS256 against the provider's JWKS, issuer, audience) and hands the
verified identity to tenants.services.sso. Off unless OIDC_ENABLED (OIDC_RP_CLIENT_ID)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import resolve_url
from django.views.generic import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from portal.exceptions import PortalError
from tenants import services

logger = logging.getLogger(__name__)

# Setting -> the key of the provider's discovery document that stands in when it is empty.
DISCOVERED = {
    "OIDC_OP_ISSUER": "issuer",
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
REFUSAL_ATTR = "oidc_refusal"  # the backend leaves why it refused on the request

_lock = threading.Lock()
_documents: dict[str, dict[str, Any]] = {}


def enabled() -> bool:
    return bool(getattr(settings, "OIDC_ENABLED", False))


def provider_name() -> str:
    return str(getattr(settings, "OIDC_PROVIDER_NAME", "") or "single sign-on")


def discovery_document() -> dict[str, Any]:
    """The provider's /.well-known/openid-configuration, fetched on first use and kept for the
    life of the process (a failed fetch is not kept: the next sign-in tries again)."""
    url = str(getattr(settings, "OIDC_OP_DISCOVERY_URL", "") or "")
    if not url:
        return {}
    with _lock:
        if url in _documents:
            return _documents[url]
    response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
    response.raise_for_status()
    document = response.json()
    if not isinstance(document, dict):
        raise ImproperlyConfigured(f"OIDC_OP_DISCOVERY_URL {url} did not return a JSON object")
    with _lock:
        _documents[url] = document
    return document


def forget_discovery() -> None:
    """Drop the fetched documents (tests; an operator changes provider with a restart)."""
    with _lock:
        _documents.clear()


def oidc_setting(attr: str, *default: Any) -> Any:
    """A setting as mozilla-django-oidc reads it, with the provider's endpoints filled in
    from its discovery document where they are not set one by one."""
    value = getattr(settings, attr, None)
    if not value and attr in DISCOVERED:
        value = discovery_document().get(DISCOVERED[attr], "")
        if not value and not default:
            raise ImproperlyConfigured(
                f"{attr} is not set and the provider's discovery document has no "
                f"{DISCOVERED[attr]!r}"
            )
    if value is None:
        if default:
            return default[0]
        raise ImproperlyConfigured(f"Setting {attr} not found")
    return value


def _refuse(request: HttpRequest, message: str) -> None:
    setattr(request, REFUSAL_ATTR, message)


class AuthenticateView(OIDCAuthenticationRequestView):  # type: ignore[misc]
    """GET /oidc/authenticate/: a fresh state, nonce and PKCE verifier in the session, then
    off to the provider's authorization endpoint."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, **kwargs: Any) -> None:
        View.__init__(self, **kwargs)  # the endpoints are read per request, not at import

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = self.get_settings("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except (requests.RequestException, ValueError, ImproperlyConfigured) as exc:
            logger.warning("OIDC provider discovery failed: %s", exc)
            messages.error(request, f"{provider_name()} cannot be reached right now; try again.")
            return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))
        self.OIDC_RP_CLIENT_ID = self.get_settings("OIDC_RP_CLIENT_ID")
        response: HttpResponse = super().get(request)
        return response


class CallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """GET /oidc/callback/: checks the state, trades the code (with the PKCE verifier) for
    tokens, and signs the user in. Every refusal (a state, nonce or signature that does not
    match, an unverified e-mail, the provider down) lands on the login page with a message;
    nobody is signed in."""

    get_settings = staticmethod(oidc_setting)

    @property
    def failure_url(self) -> str:
        return str(resolve_url(settings.LOGIN_URL))

    def login_failure(self) -> HttpResponse:
        reason = getattr(self.request, REFUSAL_ATTR, "") or (
            f"Sign-in with {provider_name()} did not complete."
        )
        messages.error(self.request, reason)
        return HttpResponseRedirect(self.failure_url)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            response: HttpResponse = super().get(request)
        except SuspiciousOperation as exc:  # state, nonce, signature, issuer, audience
            logger.warning("OIDC sign-in refused: %s", exc)
            _refuse(request, f"Sign-in with {provider_name()} was refused: {exc}")
            return self.login_failure()
        except (requests.RequestException, ValueError, ImproperlyConfigured) as exc:
            logger.warning("OIDC sign-in failed talking to the provider: %s", exc)
            _refuse(request, f"{provider_name()} did not answer as expected; try again.")
            return self.login_failure()
        return response


class Backend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """Authenticates only the callback's code exchange (never a password form), checks the
    ID token's issuer and audience on top of the library's signature and nonce checks, and
    signs in the account that the verified e-mail names (tenants.services.sso)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django builds every backend for every password check: read nothing here.
        self.UserModel = get_user_model()

    def _configure(self) -> None:
        for attr in (
            "OIDC_OP_TOKEN_ENDPOINT",
            "OIDC_OP_USER_ENDPOINT",
            "OIDC_OP_JWKS_ENDPOINT",
            "OIDC_RP_CLIENT_ID",
            "OIDC_RP_CLIENT_SECRET",
        ):
            setattr(self, attr, self.get_settings(attr))
        self.OIDC_RP_SIGN_ALGO = self.get_settings("OIDC_RP_SIGN_ALGO", "RS256")
        self.OIDC_RP_IDP_SIGN_KEY = None  # always the provider's JWKS
        self.issuer = str(self.get_settings("OIDC_OP_ISSUER", "") or "")

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        if request is None or not enabled() or "nonce" not in kwargs or "password" in kwargs:
            return None
        self._configure()
        return super().authenticate(request, **kwargs)

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        payload: dict[str, Any] = super().verify_token(token, **kwargs)
        if self.issuer and payload.get("iss") != self.issuer:
            raise SuspiciousOperation(f"the token's issuer {payload.get('iss')!r} is not ours")
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the token was issued to another client")
        if len(audiences) > 1 and payload.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("the token's authorized party is another client")
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        """The ID token's claims with the userinfo endpoint's on top (groups may be in
        either); both must be about the same subject."""
        userinfo = super().get_userinfo(access_token, id_token, payload)
        if not isinstance(userinfo, dict) or userinfo.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("userinfo is about another subject than the ID token")
        return {**payload, **userinfo}

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        if not claims.get("email"):
            _refuse(self.request, f"{provider_name()} did not share your e-mail address.")
            return False
        if claims.get("email_verified") is False or claims.get("email_verified") == "false":
            _refuse(
                self.request,
                f"{provider_name()} has not verified the e-mail address {claims['email']}; "
                "verify it there, then sign in again.",
            )
            return False
        return True

    def groups_of(self, claims: dict[str, Any]) -> list[str]:
        value = claims.get(settings.OIDC_GROUPS_CLAIM, [])
        if isinstance(value, str):
            value = [value]
        return [g for g in value if isinstance(g, str)] if isinstance(value, list) else []

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        claims = self.get_userinfo(access_token, id_token, payload)
        if not self.verify_claims(claims):
            return None
        try:
            return services.oidc_user_sign_in(
                email=str(claims["email"]),
                groups=self.groups_of(claims),
                first_name=str(claims.get("given_name") or ""),
                last_name=str(claims.get("family_name") or ""),
            )
        except PortalError as exc:
            logger.warning("OIDC sign-in of %s refused: %s", claims.get("email"), exc.message)
            _refuse(self.request, exc.message)
            return None

    def get_user(self, user_id: Any) -> Any:
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None
