from django.contrib.auth import views as auth_views
from django.urls import include, path

from tests.support.oidc_provider import views

urlpatterns = [
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("test/users/", views.set_user),
    path("test/other-jwks/", views.other_jwks),
]
