"""What every room's pages share: the tenant page decorator, the actor, scopes, form errors."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from portal.exceptions import PortalError
from tenants import selectors
from tenants.actors import Actor
from tenants.api.base import SESSION_TENANT_KEY
from tenants.models import Scope, Tenant

View = Callable[..., HttpResponse]


def tenant_page(scope: str = Scope.READ) -> Callable[[View], View]:
    """Resolve /t/<slug>/ to the caller's membership (404 if none) and require `scope`."""

    def decorator(view: View) -> View:
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, slug: str, *args: Any, **kwargs: Any) -> HttpResponse:
            tenant = Tenant.objects.filter(slug=slug, is_active=True).first()
            membership = (
                selectors.membership_get(tenant=tenant, user=request.user) if tenant else None
            )
            if membership is None:
                raise Http404("No such tenant among yours.")
            request.tenant = membership.tenant  # type: ignore[attr-defined]
            request.membership = membership  # type: ignore[attr-defined]
            request.session[SESSION_TENANT_KEY] = membership.tenant_id
            if scope not in membership.scopes:
                raise PermissionDenied(f"Your role ({membership.role}) cannot do this.")
            return view(request, membership.tenant, *args, **kwargs)

        return wrapper

    return decorator


def page_actor(request: HttpRequest) -> Actor:
    """The signed-in user acting on a page (services audit it)."""
    return Actor(user=request.user)


def can(request: HttpRequest, scope: str) -> bool:
    """Whether the page's member (set by `tenant_page`) holds `scope`."""
    return scope in request.membership.scopes  # type: ignore[attr-defined]


def can_write(request: HttpRequest) -> bool:
    return can(request, Scope.WRITE)


def can_deploy(request: HttpRequest) -> bool:
    return can(request, Scope.DEPLOY)


def can_admin(request: HttpRequest) -> bool:
    return can(request, Scope.ADMIN)


# Service fields that a page form calls by another name.
FORM_FIELD = {"artifact": "archive"}


def form_error(form: Any, exc: PortalError) -> None:
    """Put a service's PortalError on the form field it names (or on the form)."""
    error_field = getattr(form, "error_field", None)
    if error_field is not None:  # the deployment forms map service fields themselves
        form.add_error(error_field(exc.field), exc.message)
        return
    field = FORM_FIELD.get(exc.field or "", exc.field)
    form.add_error(field if field in form.fields else None, exc.message)


def throttled_page(
    request: HttpRequest, template: str, context: dict[str, Any], wait: float
) -> HttpResponse:
    """429 page with Retry-After: the attempt was not even looked at."""
    retry_after = max(1, math.ceil(wait))
    context = {**context, "throttled": True, "retry_after": retry_after}
    response = render(request, template, context, status=429)
    response["Retry-After"] = str(retry_after)
    return response
