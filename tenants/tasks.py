"""Celery tasks of the tenants room: thin wrappers that take ids and call services."""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail

from portal.celery import task
from tenants import services
from tenants.models import Invitation

logger = logging.getLogger(__name__)


@task(
    name="tenants.invitation_send_email",
    queue="default",
    time_limit=60,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
)
def invitation_send_email(invitation_id: int, accept_url: str) -> bool:
    invitation = (
        Invitation.objects.select_related("tenant", "invited_by").filter(pk=invitation_id).first()
    )
    if invitation is None or invitation.status != "pending":
        return False
    inviter = invitation.invited_by.email if invitation.invited_by else "An owner"
    send_mail(
        subject=f"You are invited to {invitation.tenant.name} on the AI Ops Portal",
        message=(
            f"{inviter} invited you to join {invitation.tenant.name} as {invitation.role}.\n\n"
            f"Accept the invitation: {accept_url}\n\n"
            f"The link expires on {invitation.expires_at:%Y-%m-%d %H:%M} UTC."
        ),
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[invitation.email],
    )
    logger.info("invitation %s mailed", invitation_id)
    return True


@task(
    name="tenants.signup_send_verification",
    queue="default",
    time_limit=60,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
)
def signup_send_verification(user_id: int, verify_url: str) -> bool:
    """Mail the signup verification link; nothing when the account is gone or active already."""
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None or user.is_active:
        return False
    ttl_hours = services.signup_verify_ttl_hours()
    send_mail(
        subject="Confirm your e-mail address for the AI Ops Portal",
        message=(
            "Someone (we hope you) signed up for the AI Ops Portal with this address.\n\n"
            f"Confirm it to activate the account: {verify_url}\n\n"
            f"The link expires in {ttl_hours} hours. If it was not you, ignore this e-mail."
        ),
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[user.email],
    )
    logger.info("signup verification for user %s mailed", user_id)
    return True


@task(name="tenants.invitations_expire", queue="default", time_limit=300, idempotent=True)
def invitations_expire() -> int:
    return services.invitations_expire()
