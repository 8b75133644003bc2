from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"

    def ready(self) -> None:
        from tenants.signals import tenant_suspension_changed

        tenant_suspension_changed.connect(_reconcile_on_suspension, dispatch_uid="serving")


def _reconcile_on_suspension(**_: object) -> None:
    """A suspended tenant's routers refuse its traffic: the desired state changed."""
    from django.conf import settings

    from serving.tasks import reconcile

    if settings.RECONCILE_ON_COMMIT:
        reconcile.delay()
