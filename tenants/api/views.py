"""Tenants API: short declarations on the scoped base; rules live in services/selectors."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import login
from django.core.validators import slug_re
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, status
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.validation import validated
from tenants import links, selectors, services, throttles, usage
from tenants.actors import Actor
from tenants.api import filters
from tenants.api import serializers as s
from tenants.api.base import TenantScopedViewSet, resolve_context
from tenants.auth import TokenUser
from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Quota, Scope, Tenant


class TenantViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    TenantScopedViewSet,
):
    """Your tenants only. PATCH renames (owner); POST creates a new tenant you own (session)."""

    queryset = Tenant.objects.none()
    serializer_class = s.TenantSerializer
    lookup_field = "slug"
    pagination_class = None
    action_scopes = {"create": Scope.READ, "partial_update": Scope.ADMIN}
    contextless_actions = frozenset({"create"})

    def scoped_queryset(self, tenant: Tenant) -> Any:
        if self.ctx.token is not None:
            return Tenant.objects.filter(pk=self.ctx.token.tenant_id)
        return selectors.tenant_list_for_user(user=self.request.user)

    def get_object(self) -> Tenant:
        slug = self.kwargs["slug"]
        # Not a slug (a NUL byte would even be a DataError in PostgreSQL): no tenant has it.
        tenant = self.get_queryset().filter(slug=slug).first() if slug_re.match(slug) else None
        if tenant is None:
            raise exceptions.NotFound()
        self.ctx = resolve_context(self.request, tenant=tenant)
        self.check_scope(self.ctx)
        return tenant

    @extend_schema(request=s.TenantCreateSerializer, responses={201: s.TenantSerializer})
    def create(self, request: Request) -> Response:
        if isinstance(request.user, TokenUser) or not request.user.is_authenticated:
            raise exceptions.PermissionDenied("Tenants are created by signed-in users, not tokens.")
        data = validated(s.TenantCreateSerializer, request.data)
        tenant = services.tenant_create(
            owner=request.user, name=data["name"], actor=Actor(user=request.user)
        )
        return Response(s.TenantSerializer(tenant).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.TenantSerializer, responses=s.TenantSerializer)
    def partial_update(self, request: Request, slug: str) -> Response:
        tenant = self.get_object()
        data = validated(s.TenantSerializer, request.data, partial=True)
        if "name" not in data:
            raise exceptions.ValidationError({"name": ["This field is required."]})
        tenant = services.tenant_update(tenant=tenant, actor=self.ctx.actor, name=data["name"])
        return Response(s.TenantSerializer(tenant).data)


class MemberViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    TenantScopedViewSet,
):
    """Members of your tenant. Owners change roles (PATCH) and remove members (DELETE)."""

    queryset = Membership.objects.none()
    serializer_class = s.MembershipSerializer
    filterset_class = filters.MembershipFilter
    action_scopes = {"partial_update": Scope.ADMIN, "destroy": Scope.ADMIN}

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.membership_list(tenant=tenant)

    @extend_schema(request=s.MembershipUpdateSerializer, responses=s.MembershipSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        membership = self.get_object()
        data = validated(s.MembershipUpdateSerializer, request.data)
        membership = services.membership_set_role(
            tenant=self.ctx.tenant, actor=self.ctx.actor, membership=membership, role=data["role"]
        )
        return Response(s.MembershipSerializer(membership).data)

    def destroy(self, request: Request, pk: str) -> Response:
        membership = self.get_object()
        services.membership_remove(
            tenant=self.ctx.tenant, actor=self.ctx.actor, membership=membership
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    TenantScopedViewSet,
):
    """Invitations by e-mail link. POST invites (the link is returned once); DELETE revokes."""

    queryset = Invitation.objects.none()
    serializer_class = s.InvitationSerializer
    filterset_class = filters.InvitationFilter
    action_scopes = {"*": Scope.ADMIN}

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.invitation_list(tenant=tenant)

    @extend_schema(
        request=s.InvitationCreateSerializer, responses={201: s.InvitationCreatedSerializer}
    )
    def create(self, request: Request) -> Response:
        data = validated(s.InvitationCreateSerializer, request.data)
        invitation, raw = services.invitation_create(
            tenant=self.ctx.tenant, actor=self.ctx.actor, email=data["email"], role=data["role"]
        )
        invitation.accept_url = links.invitation_accept_url(raw)  # type: ignore[attr-defined]
        return Response(
            s.InvitationCreatedSerializer(invitation).data, status=status.HTTP_201_CREATED
        )

    def destroy(self, request: Request, pk: str) -> Response:
        services.invitation_revoke(
            tenant=self.ctx.tenant, actor=self.ctx.actor, invitation=self.get_object()
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    TenantScopedViewSet,
):
    """API tokens. The secret is in the POST response only; DELETE or POST revoke/ revokes."""

    queryset = ApiToken.objects.none()
    serializer_class = s.ApiTokenSerializer
    filterset_class = filters.ApiTokenFilter
    action_scopes = {"*": Scope.ADMIN}

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.api_token_list(tenant=tenant)

    @extend_schema(request=s.ApiTokenCreateSerializer, responses={201: s.ApiTokenCreatedSerializer})
    def create(self, request: Request) -> Response:
        data = validated(s.ApiTokenCreateSerializer, request.data)
        token, raw = services.api_token_create(tenant=self.ctx.tenant, actor=self.ctx.actor, **data)
        token.token = raw  # type: ignore[attr-defined]
        return Response(s.ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str) -> Response:
        services.api_token_revoke(
            tenant=self.ctx.tenant, actor=self.ctx.actor, token=self.get_object()
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=s.ApiTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        token = services.api_token_revoke(
            tenant=self.ctx.tenant, actor=self.ctx.actor, token=self.get_object()
        )
        return Response(s.ApiTokenSerializer(token).data)


class QuotaViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    TenantScopedViewSet,
):
    """Your tenant's quota. Only platform staff may change it (PATCH)."""

    queryset = Quota.objects.none()
    serializer_class = s.QuotaSerializer
    action_scopes = {"partial_update": Scope.ADMIN}

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return usage.quotas_with_storage_used(Quota.objects.filter(tenant=tenant))

    @extend_schema(request=s.QuotaSerializer, responses=s.QuotaSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        quota = self.get_object()
        data = validated(s.QuotaSerializer, request.data, partial=True)
        quota = services.quota_update(tenant=self.ctx.tenant, actor=self.ctx.actor, changes=data)
        return Response(s.QuotaSerializer(quota).data)


class AuditEventViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    TenantScopedViewSet,
):
    """The audit trail of your tenant: who changed what, before and after, when."""

    queryset = AuditEvent.objects.none()
    serializer_class = s.AuditEventSerializer
    filterset_class = filters.AuditEventFilter

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.audit_event_list(tenant=tenant)


class SignupView(APIView):
    """Self-service onboarding: a new account and a new tenant it owns; signs the caller in
    (SIGNUP_MODE "open"), or e-mails a verification link first ("verify"); 403 when "closed".
    Throttled per client IP (429 with Retry-After)."""

    tenant_scoped = False
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(request=s.SignupSerializer, responses={201: s.SignupResultSerializer})
    def post(self, request: Request) -> Response:
        if services.signup_mode() == "closed":
            raise exceptions.PermissionDenied("Signup is closed on this portal.")
        wait = throttles.signup_throttle(ip=throttles.client_ip(request.META))
        if wait > 0:
            raise exceptions.Throttled(wait=wait, detail="Too many signup attempts; slow down.")
        data = validated(s.SignupSerializer, request.data)
        user, tenant = services.signup(
            email=data["email"], password=data["password"], organisation=data["organisation"]
        )
        body: dict[str, Any] = {
            "email": user.email,  # type: ignore[attr-defined]
            "tenant": s.TenantSerializer(tenant).data,
            "verification_required": not user.is_active,
        }
        if user.is_active:  # "verify" mode: no session until the e-mailed link is followed
            login(request._request, user, backend="django.contrib.auth.backends.ModelBackend")
        return Response(body, status=status.HTTP_201_CREATED)


class InvitationAcceptView(APIView):
    """Accept an invitation addressed to the signed-in user's e-mail (session, not tokens)."""

    tenant_scoped = False
    permission_classes = [IsAuthenticated]

    @extend_schema(request=s.InvitationAcceptSerializer, responses={201: s.MembershipSerializer})
    def post(self, request: Request) -> Response:
        if isinstance(request.user, TokenUser):
            raise exceptions.PermissionDenied("Invitations are accepted by people, not tokens.")
        data = validated(s.InvitationAcceptSerializer, request.data)
        membership = services.invitation_accept(user=request.user, raw_token=data["token"])
        return Response(s.MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)
