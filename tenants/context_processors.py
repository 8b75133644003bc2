"""Template context: the current tenant and the user's other tenants (for the switcher)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from tenants import selectors, services


def tenancy(request: HttpRequest) -> dict[str, Any]:
    base = {"signup_open": services.signup_mode() != "closed"}
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return base
    return {
        **base,
        "current_tenant": getattr(request, "tenant", None),
        "current_membership": getattr(request, "membership", None),
        "user_memberships": list(selectors.memberships_of_user(user=user)),
    }
