from rest_framework.routers import SimpleRouter

from serving.api import deployments, views

router = SimpleRouter()
router.register("models", views.ModelViewSet, basename="model")
router.register(
    r"models/(?P<model_pk>[0-9]+)/versions", views.ModelVersionViewSet, basename="model-version"
)

router.register("deployments", deployments.DeploymentViewSet, basename="deployment")
router.register("inference-keys", deployments.InferenceKeyViewSet, basename="inference-key")

urlpatterns = router.urls
