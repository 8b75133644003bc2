from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"

    def ready(self) -> None:
        from django.conf import settings

        from serving.control import host
        from serving.deployments import controlplane, gates
        from serving.deployments.chaos import injected_delay
        from serving.ops.analysis import gate_for
        from serving.registry import selectors as registry
        from tenants import usage
        from tenants.signals import tenant_suspension_changed

        host.install(delay=injected_delay.seconds, data=lambda: settings.DATA_DIR)
        controlplane.install()  # the Serve API guard's state, published for every process
        gates.register("sla-contract", gate_for)
        usage.register_storage_meter(
            used=lambda tenant: registry.storage_used_bytes(tenant=tenant),
            annotate=registry.quotas_with_storage_used,
        )

        tenant_suspension_changed.connect(_reconcile_on_suspension, dispatch_uid="serving")


def _reconcile_on_suspension(**_: object) -> None:
    """A suspended tenant's routers refuse its traffic: the desired state changed."""
    from django.conf import settings

    from serving.deployments.tasks import reconcile

    if settings.RECONCILE_ON_COMMIT:
        reconcile.delay()
