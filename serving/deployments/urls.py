"""Pages of the deployments room, under /t/<slug>/ (see serving/urls.py)."""

from django.urls import path

from serving.deployments import breaker_views, cost_views, pool_views, views

urlpatterns = [
    path("deployments/", views.deployments_page, name="serving-deployments"),
    path("deployments/cost/", cost_views.deployment_cost, name="serving-deployment-cost"),
    path(
        "deployments/<int:pk>/cost/<slug:form>/",
        cost_views.deployment_change_cost,
        name="serving-deployment-change-cost",
    ),
    path("pools/", pool_views.pools_page, name="serving-pools"),
    path("deployments/<int:pk>/", views.deployment_page, name="serving-deployment"),
    path(
        "deployments/<int:pk>/status/",
        views.deployment_status,
        name="serving-deployment-status",
    ),
    path(
        "deployments/<int:pk>/scale/",
        views.deployment_scale,
        name="serving-deployment-scale",
    ),
    path(
        "deployments/<int:pk>/canary/",
        views.deployment_canary,
        name="serving-deployment-canary",
    ),
    path(
        "deployments/<int:pk>/traffic/",
        views.deployment_traffic,
        name="serving-deployment-traffic",
    ),
    path(
        "deployments/<int:pk>/promote/",
        views.deployment_promote,
        name="serving-deployment-promote",
    ),
    path(
        "deployments/<int:pk>/delete/",
        views.deployment_delete,
        name="serving-deployment-delete",
    ),
    path(
        "deployments/<int:pk>/breaker/",
        breaker_views.breaker_page,
        name="serving-deployment-breaker",
    ),
    path(
        "deployments/<int:pk>/breaker/live/",
        breaker_views.breaker_live_panel,
        name="serving-deployment-breaker-live",
    ),
    path(
        "deployments/<int:pk>/keys/",
        views.inference_key_create,
        name="serving-deployment-key-create",
    ),
    path(
        "deployments/<int:pk>/keys/<int:key_pk>/revoke/",
        views.inference_key_revoke,
        name="serving-deployment-key-revoke",
    ),
]
