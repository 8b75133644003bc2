"""Pages of the ops room, under /t/<slug>/ (see serving/urls.py)."""

from django.urls import path

from serving.ops.views import checks as check_views
from serving.ops.views import compare
from serving.ops.views import health as ops_views
from serving.ops.views import playground as playground_views
from serving.ops.views import rollouts as rollout_views
from serving.ops.views import traffic as traffic_views

urlpatterns = [
    path(
        "deployments/<int:pk>/contract/",
        ops_views.contract_page,
        name="serving-deployment-contract",
    ),
    path(
        "deployments/<int:pk>/contract/v<int:version>/",
        ops_views.contract_version_page,
        name="serving-deployment-contract-version",
    ),
    path(
        "deployments/<int:pk>/contract/import/",
        ops_views.contract_import,
        name="serving-deployment-contract-import",
    ),
    path(
        "deployments/<int:pk>/contract/check/",
        ops_views.contract_check,
        name="serving-deployment-contract-check",
    ),
    path(
        "deployments/<int:pk>/health/",
        ops_views.health_page,
        name="serving-deployment-health",
    ),
    path(
        "deployments/<int:pk>/health/live/",
        ops_views.health_live,
        name="serving-deployment-health-live",
    ),
    path(
        "deployments/<int:pk>/health/series/",
        ops_views.health_series,
        name="serving-deployment-health-series",
    ),
    path(
        "deployments/<int:pk>/rollouts/",
        rollout_views.rollouts_page,
        name="serving-deployment-rollouts",
    ),
    path(
        "deployments/<int:pk>/rollouts/progress/",
        rollout_views.rollout_progress,
        name="serving-deployment-rollout-progress",
    ),
    path(
        "deployments/<int:pk>/rollouts/policy/",
        rollout_views.rollout_policy,
        name="serving-deployment-rollout-policy",
    ),
    path(
        "deployments/<int:pk>/rollouts/start/",
        rollout_views.rollout_start,
        name="serving-deployment-rollout-start",
    ),
    path(
        "deployments/<int:pk>/rollouts/<int:rollout_pk>/<slug:action>/",
        rollout_views.rollout_action,
        name="serving-deployment-rollout-action",
    ),
    path(
        "deployments/<int:pk>/rollbacks/",
        rollout_views.rollbacks_panel,
        name="serving-deployment-rollbacks",
    ),
    path(
        "deployments/<int:pk>/split/",
        traffic_views.split_panel,
        name="serving-deployment-split",
    ),
    path(
        "deployments/<int:pk>/playground/",
        playground_views.playground_page,
        name="serving-deployment-playground",
    ),
    path(
        "deployments/<int:pk>/compare/",
        compare.compare_page,
        name="serving-deployment-compare",
    ),
    # A version's golden prompts and checks (ops reads the contract; the registry's URL shape).
    path(
        "models/<int:pk>/versions/<int:version_pk>/",
        check_views.version_page,
        name="serving-version",
    ),
    path(
        "models/<int:pk>/versions/<int:version_pk>/golden/",
        check_views.version_golden,
        name="serving-version-golden",
    ),
    path(
        "models/<int:pk>/versions/<int:version_pk>/checks/",
        check_views.version_checks,
        name="serving-version-checks",
    ),
    path(
        "models/<int:pk>/versions/<int:version_pk>/verify/",
        check_views.version_check_start,
        {"kind": "verify"},
        name="serving-version-verify",
    ),
    path(
        "models/<int:pk>/versions/<int:version_pk>/benchmark/",
        check_views.version_check_start,
        {"kind": "benchmark"},
        name="serving-version-benchmark",
    ),
    path("version-checks/<int:check_pk>/", check_views.check_page, name="serving-version-check"),
    path(
        "version-checks/<int:check_pk>/live/",
        check_views.check_live,
        name="serving-version-check-live",
    ),
]
