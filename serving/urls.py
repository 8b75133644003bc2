from django.urls import path

from serving import views

urlpatterns = [
    path("t/<slug:slug>/models/", views.models_page, name="serving-models"),
    path("t/<slug:slug>/models/<int:pk>/", views.model_page, name="serving-model"),
    path("t/<slug:slug>/models/<int:pk>/delete/", views.model_delete, name="serving-model-delete"),
    path(
        "t/<slug:slug>/models/<int:pk>/versions/",
        views.version_register,
        name="serving-version-register",
    ),
    path(
        "t/<slug:slug>/models/<int:pk>/upload/", views.version_upload, name="serving-version-upload"
    ),
    path(
        "t/<slug:slug>/models/<int:pk>/versions/<int:version_pk>/row/",
        views.version_row,
        name="serving-version-row",
    ),
    path(
        "t/<slug:slug>/models/<int:pk>/versions/<int:version_pk>/delete/",
        views.version_delete,
        name="serving-version-delete",
    ),
    path("t/<slug:slug>/deployments/", views.deployments_page, name="serving-deployments"),
    path("t/<slug:slug>/deployments/<int:pk>/", views.deployment_page, name="serving-deployment"),
    path(
        "t/<slug:slug>/deployments/<int:pk>/status/",
        views.deployment_status,
        name="serving-deployment-status",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/scale/",
        views.deployment_scale,
        name="serving-deployment-scale",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/canary/",
        views.deployment_canary,
        name="serving-deployment-canary",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/traffic/",
        views.deployment_traffic,
        name="serving-deployment-traffic",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/promote/",
        views.deployment_promote,
        name="serving-deployment-promote",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/delete/",
        views.deployment_delete,
        name="serving-deployment-delete",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/keys/",
        views.inference_key_create,
        name="serving-deployment-key-create",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/keys/<int:key_pk>/revoke/",
        views.inference_key_revoke,
        name="serving-deployment-key-revoke",
    ),
]
