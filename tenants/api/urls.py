from django.urls import path
from rest_framework.routers import SimpleRouter

from tenants.api import views

router = SimpleRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("members", views.MemberViewSet, basename="member")
router.register("invitations", views.InvitationViewSet, basename="invitation")
router.register("tokens", views.ApiTokenViewSet, basename="token")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("audit-events", views.AuditEventViewSet, basename="audit-event")

urlpatterns = [
    path("signup/", views.SignupView.as_view(), name="api-signup"),
    path("invitations/accept/", views.InvitationAcceptView.as_view(), name="api-invitation-accept"),
    *router.urls,
]
