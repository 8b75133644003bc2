from rest_framework.routers import SimpleRouter

from serving.deployments import api as deployments
from serving.ops import api as ops
from serving.ops.api import checks
from serving.registry.api import views

router = SimpleRouter()
router.register("models", views.ModelViewSet, basename="model")
router.register(
    r"models/(?P<model_pk>[0-9]+)/versions", views.ModelVersionViewSet, basename="model-version"
)

router.register(
    r"models/(?P<model_pk>[0-9]+)/versions",
    checks.VersionCheckStartViewSet,
    basename="model-version-checks",
)
router.register("version-checks", checks.VersionCheckViewSet, basename="version-check")
router.register("deployments", deployments.DeploymentViewSet, basename="deployment")
router.register("deployments", ops.DeploymentOpsViewSet, basename="deployment-ops")
router.register("rollouts", ops.RolloutViewSet, basename="rollout")
router.register("rollbacks", ops.RollbackViewSet, basename="rollback")
router.register("inference-keys", deployments.InferenceKeyViewSet, basename="inference-key")

urlpatterns = router.urls
