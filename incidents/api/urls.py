from rest_framework.routers import SimpleRouter

from incidents.api import views
from incidents.drills import api as drills

router = SimpleRouter()
router.register("incidents", views.IncidentViewSet, basename="incident")
router.register("breaches", views.BreachViewSet, basename="breach")
router.register("cause-rules", views.CauseRuleViewSet, basename="cause-rule")
router.register(
    "notification-channels", views.NotificationChannelViewSet, basename="notification-channel"
)

router.register("drills", drills.DrillViewSet, basename="drill")
router.register("drill-runs", drills.DrillRunViewSet, basename="drill-run")

urlpatterns = router.urls
