"""The scoped DRF base: resolves tenant + membership once, checks scopes, applies rate limits.

Every tenant API view in every app derives from `TenantScopedViewSet` (or `TenantScopedAPIView`)
and only declares its selector, serializers and required scopes. Objects are looked up inside
the caller's tenant, so another tenant's object and a missing one give the same 404.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from django.core.validators import slug_re
from django.db import connection
from django.db.models import Model, QuerySet
from rest_framework import exceptions, generics, mixins, viewsets
from rest_framework.request import Request

from portal import ratelimit
from tenants import selectors
from tenants.actors import Actor
from tenants.auth import revocation_marker
from tenants.models import ApiToken, Membership, Scope, Tenant
from tenants.scoping import get_for_tenant

TENANT_HEADER = "HTTP_X_TENANT"
SESSION_TENANT_KEY = "active_tenant_id"
READ_ACTIONS = frozenset({"list", "retrieve", "metadata"})


@dataclass(frozen=True)
class TenantContext:
    tenant: Tenant
    scopes: frozenset[str]
    actor: Actor
    membership: Membership | None = None
    token: ApiToken | None = None


class NoTenant(exceptions.PermissionDenied):
    default_detail = "You are not a member of any tenant yet."
    default_code = "no_tenant"


class RateLimited(exceptions.Throttled):
    default_detail = "Rate limit exceeded."


def resolve_context(request: Request, tenant: Tenant | None = None) -> TenantContext:
    """The caller's tenant: the token's own, or (session) X-Tenant, the active one, the first."""
    token = request.auth if isinstance(request.auth, ApiToken) else None
    if token is not None:
        if tenant is not None and tenant.pk != token.tenant_id:
            raise exceptions.NotFound()
        return TenantContext(
            tenant=token.tenant,
            scopes=frozenset(token.scopes),
            actor=Actor(token=token),
            token=token,
        )
    user = request.user
    memberships = selectors.memberships_of_user(user=user)
    membership: Membership | None
    if tenant is not None:
        membership = memberships.filter(tenant=tenant).first()
        if membership is None:
            raise exceptions.NotFound()
    elif slug := request.META.get(TENANT_HEADER):
        # Only a well-formed slug reaches the database (a NUL byte would be a DataError there).
        membership = memberships.filter(tenant__slug=slug).first() if slug_re.match(slug) else None
        if membership is None:
            raise exceptions.NotFound("The X-Tenant header names no tenant of yours.")
    else:
        active = request.session.get(SESSION_TENANT_KEY) if hasattr(request, "session") else None
        membership = (memberships.filter(tenant_id=active).first() if active else None) or (
            memberships.first()
        )
        if membership is None:
            raise NoTenant()
    return TenantContext(
        tenant=membership.tenant,
        scopes=membership.scopes,
        actor=Actor(user=user),
        membership=membership,
    )


class TenantScopedMixin:
    """Tenant resolution, scope checks and rate limits, done once in `initial()`."""

    tenant_scoped: ClassVar[bool] = True
    # Scope needed per action (viewsets) or per HTTP method (plain views); "*" is the fallback.
    action_scopes: ClassVar[dict[str, str]] = {}
    # Actions a signed-in user may call before belonging to any tenant (e.g. creating one).
    contextless_actions: ClassVar[frozenset[str]] = frozenset()
    ctx: TenantContext

    # A strict limiter charge whose Redis reply is still in flight, and whether `dispatch`
    # installed the gate that reads it before any SQL query.
    _charge: ratelimit.Charge | None = None
    _gated = False

    def _defers_rate_limit(self, request: Request) -> bool:
        """A stock list (GET): its handler only builds a query, runs it and serialises the
        rows, so the limiter's reply may be read at its first SQL query (or at the response,
        whichever comes first) instead of before the handler: the round trip overlaps the
        query building, and nothing reaches the database before the verdict."""
        return (
            self._gated
            and getattr(self, "action", None) == "list"
            and getattr(type(self), "list", None) is mixins.ListModelMixin.list
        )

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if request.method not in ("GET", "HEAD"):
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]
        self._gated = True
        try:
            with connection.execute_wrapper(self._settle_before_sql):
                return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]
        finally:
            charge, self._charge = self._charge, None
            if charge is not None:
                charge.drop()

    def _settle_before_sql(self, execute: Any, sql: Any, params: Any, many: bool, ctx: Any) -> Any:
        if self._charge is not None:
            self.settle_rate_limit()
        return execute(sql, params, many, ctx)

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        if self._charge is not None:  # no SQL ran: the verdict still decides the answer
            try:
                self.settle_rate_limit()
            except exceptions.APIException as exc:
                response = self.handle_exception(exc)  # type: ignore[attr-defined]
        return super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        if getattr(self, "action", None) in self.contextless_actions and request.auth is None:
            return
        self.ctx = resolve_context(request)
        self.check_scope(self.ctx)
        if self._defers_rate_limit(request):
            self._charge = self.start_rate_limit(self.ctx)
        else:
            self.check_rate_limit(self.ctx)

    def required_scope(self) -> str:
        name = getattr(self, "action", None) or self.request.method.lower()  # type: ignore[attr-defined]
        if name in self.action_scopes:
            return self.action_scopes[name]
        if "*" in self.action_scopes:
            return self.action_scopes["*"]
        if name in READ_ACTIONS or self.request.method in ("GET", "HEAD", "OPTIONS"):  # type: ignore[attr-defined]
            return Scope.READ
        return Scope.WRITE

    def check_scope(self, ctx: TenantContext) -> None:
        needed = self.required_scope()
        if needed not in ctx.scopes:
            who = "token" if ctx.token is not None else f"role {ctx.membership.role!r}"  # type: ignore[union-attr]
            raise exceptions.PermissionDenied(
                f"This needs the '{needed}' scope; your {who} lacks it."
            )

    def start_rate_limit(self, ctx: TenantContext) -> ratelimit.Charge:
        """Send the charge of the tenant's (and token's) bucket; for tokens, the revocation
        check rides in the same Redis round trip. `settle_rate_limit` reads the verdict."""
        token = ctx.token
        rps = getattr(token, "tenant_rps", None) if token is not None else None
        if rps is None:
            rps = selectors.quota_get_cached(tenant=ctx.tenant)
        buckets = [ratelimit.Bucket(f"tenant:{ctx.tenant.pk}", float(rps))]
        marker = None
        if token is not None:
            marker = revocation_marker(token)
            if token.rate_limit_per_second:
                buckets.append(
                    ratelimit.Bucket(f"token:{token.pk}", float(token.rate_limit_per_second))
                )
        return ratelimit.charge_start(buckets, deny_marker=marker)

    def settle_rate_limit(self, charge: ratelimit.Charge | None = None) -> None:
        if charge is None:
            charge, self._charge = self._charge, None
        if charge is None:
            return
        try:
            wait = charge.result()
        except ratelimit.Denied:
            raise exceptions.AuthenticationFailed("This token has been revoked.") from None
        if wait > 0:
            raise RateLimited(wait=wait)

    def check_rate_limit(self, ctx: TenantContext) -> None:
        """Charge the tenant's (and token's) bucket and read the verdict now."""
        self.settle_rate_limit(self.start_rate_limit(ctx))


class TenantScopedViewSet(TenantScopedMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    """Base of every tenant API viewset: declare `scoped_queryset(tenant)` and serializers."""

    def scoped_queryset(self, tenant: Tenant) -> QuerySet[Any]:
        raise NotImplementedError

    def filter_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Run the filter backends only when a filter parameter is present (hot-path saving)."""
        filterset = getattr(self, "filterset_class", None)
        if filterset is not None and not set(self.request.query_params) & set(
            filterset.base_filters
        ):
            return queryset
        return super().filter_queryset(queryset)

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):
            if self.queryset is None:
                raise TypeError(
                    f"{type(self).__name__} must declare queryset = Model.objects.none()"
                )
            return self.queryset
        return self.scoped_queryset(self.ctx.tenant)

    def get_object(self) -> Model:
        lookup = self.lookup_url_kwarg or self.lookup_field
        obj = get_for_tenant(
            self.filter_queryset(self.get_queryset()),
            tenant=self.ctx.tenant,
            pk=self.kwargs[lookup],
            field=self.lookup_field,
        )
        self.check_object_permissions(self.request, obj)
        return obj


class TenantScopedAPIView(TenantScopedMixin, generics.GenericAPIView):  # type: ignore[type-arg]
    """Base of tenant API views that are not viewsets."""
