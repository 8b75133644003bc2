from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from portal import glance, health_urls, status_views
from serving.deployments import pool_views
from serving.registry import views as registry_views
from serving.telemetry import metrics as metrics_views
from tenants.views import ThrottledLoginView

api_v1 = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("", include("tenants.api.urls")),
    path("", include("serving.api.urls")),
    path("", include("incidents.api.urls")),
]

urlpatterns = [
    # The admin signs in through the portal's login (throttle, two-factor), not its own form.
    path("admin/login/", RedirectView.as_view(pattern_name="login", query_string=True)),
    path("admin/", admin.site.urls),
    # Before django.contrib.auth.urls: the same URL and name, with a throttle in front.
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),
    # Single sign-on (tenants.oidc): 404 unless OIDC_RP_CLIENT_ID is set.
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include(api_v1)),
    path("healthz", include("portal.health_urls")),
    path("livez", health_urls.livez, name="livez"),
    path("readyz", health_urls.readyz, name="readyz"),
    path("platform/status/", status_views.platform_status, name="platform-status"),
    path("platform/pools/new/", pool_views.pool_edit, name="platform-pool-new"),
    path("platform/pools/<int:pk>/", pool_views.pool_edit, name="platform-pool"),
    path("metrics", metrics_views.metrics, name="metrics"),
    path("metrics/rules", metrics_views.metrics_rules, name="metrics-rules"),
    # Replicas on any Ray node fetch a version's files here, by a URL the portal signed.
    path(
        "artifacts/v1/<int:version_id>/<str:sha256>.tar",
        registry_views.artifact_download,
        name="artifact-download",
    ),
    # The tenant's home (composition: it reads serving and incidents).
    path("t/<slug:slug>/", glance.tenant_overview, name="tenant-overview"),
    path("t/<slug:slug>/overview/live/", glance.tenant_overview_live, name="tenant-overview-live"),
    path("", include("tenants.urls")),
    path("", include("serving.urls")),
    path("", include("incidents.urls")),
]

handler400 = "portal.middleware.bad_request"
handler500 = "portal.middleware.server_error"
