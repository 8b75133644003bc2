from django.urls import path

from serving import gpu_views, ops_views, rollout_views, views

urlpatterns = [
    path("t/<slug:slug>/gpus/", gpu_views.gpu_dashboard, name="serving-gpus"),
    path(
        "t/<slug:slug>/gpus/deployments/",
        gpu_views.gpu_deployments,
        name="serving-gpus-deployments",
    ),
    path("t/<slug:slug>/gpus/history/", gpu_views.gpu_history, name="serving-gpus-history"),
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
    # The ops loop of one deployment (serving.ops_views): contract, health, rollouts, rollbacks.
    path(
        "t/<slug:slug>/deployments/<int:pk>/contract/",
        ops_views.contract_page,
        name="serving-deployment-contract",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/contract/v<int:version>/",
        ops_views.contract_version_page,
        name="serving-deployment-contract-version",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/contract/import/",
        ops_views.contract_import,
        name="serving-deployment-contract-import",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/health/",
        ops_views.health_page,
        name="serving-deployment-health",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/health/live/",
        ops_views.health_live,
        name="serving-deployment-health-live",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/health/series/",
        ops_views.health_series,
        name="serving-deployment-health-series",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/rollouts/",
        rollout_views.rollouts_page,
        name="serving-deployment-rollouts",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/rollouts/progress/",
        rollout_views.rollout_progress,
        name="serving-deployment-rollout-progress",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/rollouts/policy/",
        rollout_views.rollout_policy,
        name="serving-deployment-rollout-policy",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/rollouts/start/",
        rollout_views.rollout_start,
        name="serving-deployment-rollout-start",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/rollouts/<int:rollout_pk>/<slug:action>/",
        rollout_views.rollout_action,
        name="serving-deployment-rollout-action",
    ),
    path(
        "t/<slug:slug>/deployments/<int:pk>/rollbacks/",
        rollout_views.rollbacks_panel,
        name="serving-deployment-rollbacks",
    ),
]
