"""Pages of the telemetry room, under /t/<slug>/ (see serving/urls.py)."""

from django.urls import path

from serving.telemetry import request_views
from serving.telemetry import views as gpu_views

urlpatterns = [
    path("gpus/", gpu_views.gpu_dashboard, name="serving-gpus"),
    path(
        "gpus/deployments/",
        gpu_views.gpu_deployments,
        name="serving-gpus-deployments",
    ),
    path("gpus/memory/", gpu_views.gpu_memory, name="serving-gpus-memory"),
    path("gpus/history/", gpu_views.gpu_history, name="serving-gpus-history"),
    path(
        "deployments/<int:pk>/requests/",
        request_views.deployment_requests,
        name="serving-deployment-requests",
    ),
]
