from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "incidents"

    def ready(self) -> None:
        """Subscribe to the ops loop's events: serving never imports incidents, it tells the
        listeners registered here (serving.ops.events)."""
        from incidents.config_drift import record_drift
        from incidents.receivers import IncidentsListener
        from incidents.selectors import open_counts_by_deployment
        from serving.deployments import drift
        from serving.ops import events
        from serving.telemetry import panels

        events.subscribe(IncidentsListener())
        drift.subscribe(record_drift)
        panels.register_deployment_counts("incidents", open_counts_by_deployment)
