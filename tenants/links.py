"""The links the tenants room e-mails: the signed signup-verification link (and the
fingerprint that makes it single-use) and the invitation accept link, both absolute URLs
under PORTAL_BASE_URL."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import User
from django.core import signing
from django.urls import reverse
from django.utils.crypto import salted_hmac

SIGNUP_VERIFY_SALT = "tenants.signup-verify"


def verification_fingerprint(user: User) -> str:
    """Changes once the account is activated (or its password or e-mail changes): a link
    works once, and never reactivates an account that staff deactivated after it was used."""
    state = f"{user.pk}:{user.password}:{user.email}:{user.is_active}:{user.last_login}"
    return salted_hmac(SIGNUP_VERIFY_SALT, state).hexdigest()[:20]


def signup_verification_url(user: User) -> str:
    token = signing.dumps(
        {"u": user.pk, "f": verification_fingerprint(user)}, salt=SIGNUP_VERIFY_SALT
    )
    return settings.PORTAL_BASE_URL.rstrip("/") + reverse("signup-verify", args=[token])


def invitation_accept_url(raw_token: str) -> str:
    return settings.PORTAL_BASE_URL.rstrip("/") + reverse("invitation-accept", args=[raw_token])
