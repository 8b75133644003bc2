import sys

from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Portal"

    def ready(self) -> None:
        from portal import tracing

        # Spans over OTLP when an endpoint is configured (portal.tracing); the service name
        # says which process: a Celery worker or beat, else the web server.
        role = next((a for a in sys.argv[1:3] if a in ("worker", "beat")), "web")
        tracing.configure(f"portal-{role}")
        tracing.connect_celery()
