"""Pages of two-factor sign-in: the second step of the password login (the session is not
signed in until the code is right) and the account's security page (enrol, disable)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters

from portal import ratelimit
from portal.exceptions import PortalError
from tenants import oidc
from tenants import selectors as tenant_selectors
from tenants.mfa import selectors, services
from tenants.models import ApiToken
from tenants.pages import throttled_page
from tenants.throttles import client_ip

PENDING_KEY = "mfa_pending"  # the session's half-done sign-in: who, how, where to, since when


class CodeForm(forms.Form):
    code = forms.CharField(
        max_length=20,
        label="Code",
        help_text="Six digits from your authenticator app, or one of your recovery codes.",
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "autofocus": True}),
    )


class DisableForm(forms.Form):
    password = forms.CharField(widget=forms.PasswordInput, strip=False)
    code = forms.CharField(max_length=20, label="Code from your app, or a recovery code")


def code_throttle(*, user_id: int, ip: str) -> float:
    """Charge one code attempt per user and per client IP (like the password login's
    throttle); seconds to wait when either is spent, else 0."""
    window_s = max(1, int(settings.AUTH_THROTTLE_WINDOW_S))
    buckets = []
    for kind, subject, limit in (
        ("totp-user", str(user_id), settings.TOTP_THROTTLE_PER_USER),
        ("totp-ip", ip, settings.LOGIN_THROTTLE_PER_IP),
    ):
        digest = hashlib.sha256(subject.encode()).hexdigest()[:32]
        limit = max(1, int(limit))
        buckets.append(ratelimit.Bucket(f"{kind}:{digest}", limit / window_s, burst=limit))
    return ratelimit.throttle(buckets)


def login_challenge(request: HttpRequest, user: Any, next_url: str) -> HttpResponse | None:
    """Called by the password login once the password is right: when the user has two-factor
    on, remember who is half-way in (not signed in) and ask for the code; else None."""
    if not selectors.totp_enabled(user=user):
        return None
    request.session.cycle_key()
    request.session[PENDING_KEY] = {
        "user": user.pk,
        "backend": getattr(user, "backend", settings.AUTHENTICATION_BACKENDS[0]),
        "next": next_url,
        "at": time.time(),
    }
    return redirect("login-code")


def _pending_user(request: HttpRequest) -> tuple[Any, dict[str, Any]] | None:
    pending = request.session.get(PENDING_KEY)
    if not isinstance(pending, dict) or time.time() - pending["at"] > settings.TOTP_PENDING_S:
        request.session.pop(PENDING_KEY, None)
        return None
    user = get_user_model().objects.filter(pk=pending["user"], is_active=True).first()
    return (user, pending) if user is not None else None


@never_cache
@sensitive_post_parameters("code")
def login_code(request: HttpRequest) -> HttpResponse:
    """The second step: six digits (or a recovery code) before the session is signed in."""
    template = "registration/login_code.html"
    found = _pending_user(request)
    if found is None:
        messages.info(request, "Enter your e-mail and password again.")
        return redirect("login")
    user, pending = found
    form = CodeForm(request.POST or None)
    if request.method == "POST":
        wait = code_throttle(user_id=user.pk, ip=client_ip(request.META))
        if wait > 0:
            return throttled_page(request, template, {"form": form}, wait)
        if form.is_valid():
            try:
                used = services.totp_verify(user=user, code=form.cleaned_data["code"])
            except PortalError as exc:
                form.add_error("code", exc.message)
            else:
                del request.session[PENDING_KEY]
                login(request, user, backend=pending["backend"])
                if used == "recovery":
                    left = selectors.recovery_codes_left(device=user.totp_device)
                    messages.warning(request, f"You used a recovery code; {left} left.")
                return redirect(pending["next"])
    return render(request, template, {"form": form})


@login_required
@never_cache
@sensitive_post_parameters("password", "code")
def account_security(request: HttpRequest) -> HttpResponse:
    """Two-factor for the signed-in user: set up (the secret and its otpauth:// URI shown
    once, confirmed with a code; then the recovery codes, shown once), or disable."""
    template = "tenants/account_security.html"
    user: Any = request.user
    context: dict[str, Any] = {
        "sso_only": not user.has_usable_password(),
        "provider_name": oidc.provider_name(),
        "code_form": CodeForm(),
        "disable_form": DisableForm(),
    }
    action = request.POST.get("action", "") if request.method == "POST" else ""
    if action in ("confirm", "disable"):
        wait = code_throttle(user_id=user.pk, ip=client_ip(request.META))
        if wait > 0:
            return throttled_page(request, template, _status(user, context), wait)
    try:
        if action == "start":
            device, uri = services.totp_enrolment_start(user=user)
            context["enrolment_uri"] = uri
            context["enrolment_secret"] = device.secret
        elif action == "confirm":
            form = CodeForm(request.POST)
            context["code_form"] = form
            if form.is_valid():
                context["recovery_codes"] = services.totp_enrolment_confirm(
                    user=user, code=form.cleaned_data["code"]
                )
                messages.success(request, "Two-factor sign-in is on.")
        elif action == "disable":
            disable = DisableForm(request.POST)
            context["disable_form"] = disable
            if disable.is_valid():
                services.totp_disable(user=user, **disable.cleaned_data)
                messages.success(request, "Two-factor sign-in is off.")
                return redirect("account-security")
    except PortalError as exc:
        target = context["disable_form"] if action == "disable" else context["code_form"]
        if target.is_bound:
            target.add_error(exc.field if exc.field in target.fields else None, exc.message)
        else:
            messages.error(request, exc.message)
    return render(request, template, _status(user, context))


def _status(user: Any, context: dict[str, Any]) -> dict[str, Any]:
    device = selectors.totp_device_get(user=user)
    enabled = device is not None and device.confirmed_at is not None
    return {
        **context,
        "enabled": enabled,
        "waiting": device is not None and not enabled,
        "codes_left": selectors.recovery_codes_left(device=device) if enabled and device else 0,
        # The account's other halves: where it is a member, and the live tokens it made.
        "memberships": tenant_selectors.memberships_of_user(user=user).select_related("tenant"),
        "my_tokens": ApiToken.objects.filter(
            created_by=user, revoked_at__isnull=True, expires_at__gt=timezone.now()
        )
        .select_related("tenant")
        .order_by("tenant__name", "name"),
    }
