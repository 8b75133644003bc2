from django.urls import path

from tenants import audit_views, views
from tenants.mfa import views as mfa_views

urlpatterns = [
    path("", views.home, name="home"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/verify/<str:token>/", views.signup_verify, name="signup-verify"),
    path("accounts/login/code/", mfa_views.login_code, name="login-code"),
    path("accounts/security/", mfa_views.account_security, name="account-security"),
    path("tenants/new/", views.tenant_new, name="tenant-new"),
    path("switch/", views.switch_tenant, name="tenant-switch"),
    path("invite/<str:token>/", views.invitation_accept, name="invitation-accept"),
    path("t/<slug:slug>/settings/", views.tenant_settings, name="tenant-settings"),
    path("t/<slug:slug>/members/", views.members, name="tenant-members"),
    path("t/<slug:slug>/members/<int:pk>/role/", views.member_role, name="member-role"),
    path("t/<slug:slug>/members/<int:pk>/remove/", views.member_remove, name="member-remove"),
    path(
        "t/<slug:slug>/invitations/<int:pk>/revoke/",
        views.invitation_revoke,
        name="invitation-revoke",
    ),
    path("t/<slug:slug>/tokens/", views.tokens, name="tenant-tokens"),
    path("t/<slug:slug>/tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("t/<slug:slug>/audit/", audit_views.audit_log, name="tenant-audit"),
]
