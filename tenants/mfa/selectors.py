"""Reads of two-factor sign-in: whether a user has it on, and their authenticator."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from tenants.models import TotpDevice


def totp_device_get(*, user: AbstractBaseUser | AnonymousUser) -> TotpDevice | None:
    """The user's authenticator, confirmed or waiting for its first code."""
    if user.pk is None:
        return None
    return TotpDevice.objects.filter(user_id=user.pk).first()


def totp_enabled(*, user: AbstractBaseUser | AnonymousUser) -> bool:
    """Two-factor is on: the password alone does not sign this user in."""
    device = totp_device_get(user=user)
    return device is not None and device.confirmed_at is not None


def recovery_codes_left(*, device: TotpDevice) -> int:
    return device.recovery_codes.filter(used_at__isnull=True).count()
