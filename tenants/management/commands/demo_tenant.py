"""Create (or refresh) the demo tenant and its owner login, and print the login."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from tenants import services
from tenants.actors import Actor
from tenants.models import Membership, Role

DEMO_EMAIL = "demo@example.com"
DEMO_ORG = "Demo Tenant"


class Command(BaseCommand):
    help = "Create the demo tenant with an owner login (idempotent) and print the login."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--email", default=os.environ.get("DEMO_EMAIL", DEMO_EMAIL))
        parser.add_argument("--organisation", default=DEMO_ORG)

    def handle(self, *args: Any, email: str, organisation: str, **options: Any) -> None:
        password = os.environ.get("DEMO_PASSWORD") or secrets.token_urlsafe(12)
        user_model = get_user_model()
        with transaction.atomic():
            user = user_model.objects.filter(username=email).first()
            if user is None:
                user, tenant = services.signup(
                    email=email, password=password, organisation=organisation
                )
            else:
                user.set_password(password)
                user.save(update_fields=["password"])
                owned = Membership.objects.filter(user=user, role=Role.OWNER).select_related(
                    "tenant"
                )
                membership = owned.first()
                tenant = (
                    membership.tenant
                    if membership
                    else services.tenant_create(
                        owner=user, name=organisation, actor=Actor(user=user)
                    )
                )
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo tenant '{tenant.name}' ({tenant.slug}) is ready.\n"
                f"  Log in at http://127.0.0.1:{os.environ.get('PORT', '8000')}/accounts/login/\n"
                f"  e-mail:   {email}\n"
                f"  password: {password}"
            )
        )
