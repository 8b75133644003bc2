"""The serving rooms' pages, each under /t/<slug>/ (URL names unchanged)."""

from django.urls import include, path

urlpatterns = [
    path("t/<slug:slug>/", include("serving.registry.urls")),
    path("t/<slug:slug>/", include("serving.deployments.urls")),
    path("t/<slug:slug>/", include("serving.ops.urls")),
    path("t/<slug:slug>/", include("serving.telemetry.urls")),
]
