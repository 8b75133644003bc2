"""The writes of two-factor sign-in: enrol an authenticator (the secret shown once, confirmed
with a code), check a sign-in code (a code is accepted once: its 30-second step must be newer
than the last one used; a recovery code is spent), disable with the password and a code.
Every change is audited in each tenant the user belongs to."""

from __future__ import annotations

import hmac
import secrets
from typing import Any

import pyotp
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from portal.exceptions import ConflictError, PermissionDeniedError, ValidationFailed
from tenants.actors import Actor
from tenants.mfa import selectors
from tenants.models import Membership, RecoveryCode, TotpDevice
from tenants.secrets import hash_secret
from tenants.services.audit import audit_record

RECOVERY_CODE_COUNT = 10
_RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i to misread
# Steps either side of now a code may come from: one 30-second step of clock drift.
TOTP_DRIFT_STEPS = 1


def _audit_everywhere(
    *, user: User, device: TotpDevice, action: str, after: dict[str, Any]
) -> None:
    """Two-factor belongs to the user, not to a tenant: each tenant's owners see it."""
    for membership in Membership.objects.filter(user=user).select_related("tenant"):
        audit_record(
            tenant=membership.tenant, actor=Actor(user=user), action=action, obj=device, after=after
        )


def recovery_code_hash(*, user_id: int, code: str) -> str:
    """Digest of a recovery code, salted with its owner (codes are 50 random bits)."""
    normalised = code.strip().lower().replace("-", "").replace(" ", "")
    return hash_secret(f"recovery:{user_id}:{normalised}")


def _new_recovery_codes() -> list[str]:
    codes = []
    for _ in range(RECOVERY_CODE_COUNT):
        raw = "".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(10))
        codes.append(f"{raw[:5]}-{raw[5:]}")
    return codes


def _matching_step(secret: str, code: str) -> int | None:
    """The 30-second step `code` belongs to, within the allowed drift, else None."""
    totp = pyotp.TOTP(secret)
    now = totp.timecode(timezone.now())
    for step in range(now - TOTP_DRIFT_STEPS, now + TOTP_DRIFT_STEPS + 1):
        if hmac.compare_digest(totp.generate_otp(step), code):
            return step
    return None


def _accept_totp(device: TotpDevice, code: str) -> bool:
    """Check a 6-digit code against a locked device and spend its step. Caller holds the
    atomic and the row lock, so two requests with one code cannot both pass."""
    step = _matching_step(device.secret, code)
    if step is None:
        return False
    if device.last_used_step is not None and step <= device.last_used_step:
        raise ValidationFailed(
            "This code was already used; wait for the next one from your app.", field="code"
        )
    device.last_used_step = step
    device.save(update_fields=["last_used_step"])
    return True


def totp_enrolment_start(*, user: User) -> tuple[TotpDevice, str]:
    """A new secret for `user` (replacing an unconfirmed one): returns the device and the
    otpauth:// URI to show once. Refused while two-factor is on."""
    if not user.has_usable_password():
        raise PermissionDeniedError(
            "Your account signs in through single sign-on; its provider handles two-factor.",
            field="user",
        )
    with transaction.atomic():
        device = TotpDevice.objects.select_for_update().filter(user=user).first()
        if device is not None and device.confirmed_at is not None:
            raise ConflictError("Two-factor is already on; disable it first.", field="user")
        if device is None:
            device = TotpDevice(user=user)
        device.secret = pyotp.random_base32()
        device.last_used_step = None
        device.created_at = timezone.now()
        device.full_clean()
        device.save()
    uri = pyotp.TOTP(device.secret).provisioning_uri(
        name=user.email or user.get_username(), issuer_name=settings.TOTP_ISSUER
    )
    return device, uri


def totp_enrolment_confirm(*, user: User, code: str) -> list[str]:
    """Turn two-factor on with a first code from the app; returns the recovery codes, which
    are shown once (only their digests are kept)."""
    code = (code or "").strip()
    with transaction.atomic():
        device = TotpDevice.objects.select_for_update().filter(user=user).first()
        if device is None or device.confirmed_at is not None:
            raise ConflictError(
                "Start the set-up again: no authenticator is waiting.", field="code"
            )
        if not _accept_totp(device, code):
            raise ValidationFailed(
                "That code is not right; check the clock of the device.", field="code"
            )
        device.confirmed_at = timezone.now()
        device.save(update_fields=["confirmed_at"])
        codes = _new_recovery_codes()
        RecoveryCode.objects.bulk_create(
            RecoveryCode(device=device, code_hash=recovery_code_hash(user_id=user.pk, code=c))
            for c in codes
        )
        _audit_everywhere(
            user=user, device=device, action="user.two_factor_enabled", after={"method": "totp"}
        )
    return codes


def totp_verify(*, user: User, code: str) -> str:
    """Check a sign-in code: six digits from the app ("totp"), or a recovery code, which is
    spent ("recovery"). Raises ValidationFailed (field `code`) when it is not right."""
    code = (code or "").strip()
    with transaction.atomic():
        device = TotpDevice.objects.select_for_update().filter(user=user).first()
        if device is None or device.confirmed_at is None:
            raise ValidationFailed("Two-factor is not on for this account.", field="code")
        if code.isdigit() and len(code) == 6:
            if _accept_totp(device, code):
                return "totp"
            raise ValidationFailed("That code is not right.", field="code")
        recovery = (
            RecoveryCode.objects.select_for_update()
            .filter(
                device=device,
                code_hash=recovery_code_hash(user_id=user.pk, code=code),
                used_at__isnull=True,
            )
            .first()
        )
        if recovery is None:
            raise ValidationFailed("That code is not right.", field="code")
        recovery.used_at = timezone.now()
        recovery.save(update_fields=["used_at"])
        _audit_everywhere(
            user=user,
            device=device,
            action="user.recovery_code_used",
            after={"left": selectors.recovery_codes_left(device=device)},
        )
    return "recovery"


def totp_disable(*, user: User, password: str, code: str) -> None:
    """Turn two-factor off: needs the account's password and a current code (or a recovery
    code), so a session left open is not enough."""
    if not user.check_password(password or ""):
        raise ValidationFailed("The password is not right.", field="password")
    with transaction.atomic():
        totp_verify(user=user, code=code)
        device = TotpDevice.objects.select_for_update().get(user=user)
        _audit_everywhere(
            user=user, device=device, action="user.two_factor_disabled", after={"method": "totp"}
        )
        device.delete()
