"""Pages of the tenants room: onboarding, tenant settings, members, tokens, audit log."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from tenants import forms, links, oidc, selectors, services, throttles, usage
from tenants.api.base import SESSION_TENANT_KEY
from tenants.mfa import views as mfa_views
from tenants.models import ApiToken, Invitation, Membership, Scope, Tenant
from tenants.pages import page_actor, tenant_page, throttled_page
from tenants.scoping import get_for_tenant


def _form_errors(form: Any, exc: PortalError | DjangoValidationError) -> None:
    if isinstance(exc, PortalError):
        field = exc.field if exc.field in form.fields else None
        form.add_error(field, exc.message)
    else:
        form.add_error(None, exc)


def home(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return redirect("login")
    memberships = list(selectors.memberships_of_user(user=request.user))
    if not memberships:
        return redirect("tenant-new")
    active = request.session.get(SESSION_TENANT_KEY)
    chosen = next((m for m in memberships if m.tenant_id == active), memberships[0])
    return redirect("tenant-overview", slug=chosen.tenant.slug)


@sensitive_post_parameters("password")
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("home")
    mode = services.signup_mode()
    if mode == "closed":
        return render(request, "tenants/signup.html", {"closed": True}, status=403)
    form = forms.SignupForm(request.POST or None)
    if request.method == "POST":
        wait = throttles.signup_throttle(ip=throttles.client_ip(request.META))
        if wait > 0:
            return throttled_page(request, "tenants/signup.html", {"form": form}, wait)
    if request.method == "POST" and form.is_valid():
        try:
            user, tenant = services.signup(**form.cleaned_data)
        except PortalError as exc:
            _form_errors(form, exc)
        else:
            if not user.is_active:
                context = {"email": user.email, "ttl_hours": services.signup_verify_ttl_hours()}
                return render(request, "tenants/signup_verify_sent.html", context)
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            messages.success(request, f"Welcome! You own the new tenant {tenant.name}.")
            return redirect("tenant-overview", slug=tenant.slug)
    return render(request, "tenants/signup.html", {"form": form, "verify": mode == "verify"})


def signup_verify(request: HttpRequest, token: str) -> HttpResponse:
    """Follow the e-mailed link: activates the account, then the user logs in."""
    try:
        user = services.signup_verify(token=token)
    except PortalError as exc:
        return render(request, "tenants/signup_verify.html", {"error": exc.message}, status=400)
    messages.success(request, f"{user.email} is confirmed. Log in to continue.")
    return redirect("login")


class ThrottledLoginView(auth_views.LoginView):
    """Django's login, behind a throttle per e-mail and per client IP: a throttled attempt
    gets 429 with Retry-After and its password is never checked."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        wait = throttles.login_throttle(
            email=str(request.POST.get("username", "")), ip=throttles.client_ip(request.META)
        )
        if wait > 0:
            context = self.get_context_data(form=self.get_form_class()(request))
            return throttled_page(request, self.template_name, context, wait)
        return super().post(request, *args, **kwargs)

    def form_valid(self, form: Any) -> HttpResponse:
        """A right password signs in, unless two-factor is on: then the code comes first."""
        challenge = mfa_views.login_challenge(self.request, form.get_user(), self.get_success_url())
        return challenge or super().form_valid(form)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["signup_open"] = services.signup_mode() != "closed"
        context["oidc_provider"] = oidc.provider_name() if oidc.enabled() else ""
        return context


@login_required
def tenant_new(request: HttpRequest) -> HttpResponse:
    form = forms.NewTenantForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            tenant = services.tenant_create(
                owner=request.user, name=form.cleaned_data["name"], actor=page_actor(request)
            )
        except PortalError as exc:
            _form_errors(form, exc)
        else:
            return redirect("tenant-overview", slug=tenant.slug)
    return render(request, "tenants/tenant_new.html", {"form": form})


@tenant_page()
def tenant_settings(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = forms.TenantSettingsForm(request.POST or None, initial={"name": tenant.name})
    if request.method == "POST":
        if Scope.ADMIN not in request.membership.scopes:  # type: ignore[attr-defined]
            raise PermissionDenied("Only owners change tenant settings.")
        if form.is_valid():
            try:
                services.tenant_update(
                    tenant=tenant, actor=page_actor(request), **form.cleaned_data
                )
            except (PortalError, DjangoValidationError) as exc:
                _form_errors(form, exc)
            else:
                messages.success(request, "Settings saved.")
                return redirect("tenant-settings", slug=tenant.slug)
    return render(
        request,
        "tenants/settings.html",
        {
            "form": form,
            "quota": selectors.quota_get(tenant=tenant),
            "storage_used_bytes": usage.storage_used_bytes(tenant),
        },
    )


@tenant_page()
def members(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    invite_form = forms.InviteForm(request.POST or None)
    invite_url = None
    if request.method == "POST":
        if Scope.ADMIN not in request.membership.scopes:  # type: ignore[attr-defined]
            raise PermissionDenied("Only owners invite members.")
        if invite_form.is_valid():
            try:
                _, raw = services.invitation_create(
                    tenant=tenant, actor=page_actor(request), **invite_form.cleaned_data
                )
            except PortalError as exc:
                _form_errors(invite_form, exc)
            else:
                invite_url = links.invitation_accept_url(raw)
                messages.success(
                    request, f"Invitation sent to {invite_form.cleaned_data['email']}."
                )
                invite_form = forms.InviteForm()
    memberships = list(selectors.membership_list(tenant=tenant))
    if Scope.ADMIN in request.membership.scopes:  # type: ignore[attr-defined]
        # What removing each member revokes, shown beside the button before anyone clicks it.
        counts = selectors.membership_offboarding_counts(tenant=tenant)
        for m in memberships:
            found = counts.get(m.user_id, {})
            m.revokes_tokens = found.get("tokens", 0)  # type: ignore[attr-defined]
            m.revokes_invitations = found.get("invitations", 0)  # type: ignore[attr-defined]
    context = {
        "memberships": memberships,
        "invitations": selectors.invitation_list(tenant=tenant).order_by("-id")[:50],
        "invite_form": invite_form,
        "invite_url": invite_url,
        "roles": forms.RoleForm.base_fields["role"].choices,  # type: ignore[attr-defined]
    }
    return render(request, "tenants/members.html", context)


@require_POST
@tenant_page(Scope.ADMIN)
def member_role(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    membership = get_for_tenant(Membership.objects.all(), tenant=tenant, pk=pk)
    form = forms.RoleForm(request.POST)
    if form.is_valid():
        try:
            services.membership_set_role(
                tenant=tenant, actor=page_actor(request), membership=membership, **form.cleaned_data
            )
            messages.success(
                request, f"{membership.user.email} is now {form.cleaned_data['role']}."
            )
        except PortalError as exc:
            messages.error(request, exc.message)
    else:
        messages.error(request, "Choose a valid role.")
    return redirect("tenant-members", slug=tenant.slug)


@require_POST
@tenant_page(Scope.ADMIN)
def member_remove(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    membership = get_for_tenant(Membership.objects.select_related("user"), tenant=tenant, pk=pk)
    try:
        counts = services.membership_remove(
            tenant=tenant, actor=page_actor(request), membership=membership
        )
        messages.success(
            request,
            f"Removed {membership.user.email}; revoked {counts['tokens']} API token(s) "
            f"and {counts['invitations']} pending invitation(s) they had created.",
        )
    except PortalError as exc:
        messages.error(request, exc.message)
    return redirect("tenant-members", slug=tenant.slug)


@require_POST
@tenant_page(Scope.ADMIN)
def invitation_revoke(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    invitation = get_for_tenant(Invitation.objects.all(), tenant=tenant, pk=pk)
    try:
        services.invitation_revoke(tenant=tenant, actor=page_actor(request), invitation=invitation)
        messages.success(request, f"Revoked the invitation of {invitation.email}.")
    except PortalError as exc:
        messages.error(request, exc.message)
    return redirect("tenant-members", slug=tenant.slug)


@tenant_page(Scope.ADMIN)
def tokens(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = forms.TokenForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        try:
            token, raw = services.api_token_create(
                tenant=tenant, actor=page_actor(request), **form.cleaned_data
            )
        except PortalError as exc:
            _form_errors(form, exc)
        else:
            created = {"token": token, "raw": raw}
            form = forms.TokenForm()
    context = {
        "form": form,
        "created": created,
        "tokens": selectors.api_token_list(tenant=tenant).order_by("-id"),
    }
    return render(request, "tenants/tokens.html", context)


@require_POST
@tenant_page(Scope.ADMIN)
def token_revoke(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    token = get_for_tenant(ApiToken.objects.all(), tenant=tenant, pk=pk)
    token = services.api_token_revoke(tenant=tenant, actor=page_actor(request), token=token)
    if request.headers.get("HX-Request"):
        return render(request, "tenants/_token_row.html", {"t": token})
    messages.success(request, f"Revoked {token.name}.")
    return redirect("tenant-tokens", slug=tenant.slug)


def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    invitation = selectors.invitation_get_by_token(raw_token=token)
    if invitation is None:
        raise Http404("This invitation link is not valid.")
    if not request.user.is_authenticated:
        return render(request, "tenants/invitation.html", {"invitation": invitation, "anon": True})
    if request.method == "POST":
        try:
            membership = services.invitation_accept(user=request.user, raw_token=token)
        except PortalError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"You joined {membership.tenant.name}.")
            return redirect("tenant-overview", slug=membership.tenant.slug)
    return render(request, "tenants/invitation.html", {"invitation": invitation})


@require_POST
@login_required
def switch_tenant(request: HttpRequest) -> HttpResponse:
    slug = request.POST.get("slug", "")
    membership = selectors.memberships_of_user(user=request.user).filter(tenant__slug=slug).first()
    if membership is None:
        raise Http404("No such tenant among yours.")
    request.session[SESSION_TENANT_KEY] = membership.tenant_id
    return redirect("tenant-overview", slug=membership.tenant.slug)
