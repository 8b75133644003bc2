"""WebSocket routes of the serving app (collected by portal.routing)."""

from __future__ import annotations

from django.urls import path

from serving.telemetry.consumers import GpuConsumer

websocket_urlpatterns = [
    path("ws/gpu/", GpuConsumer.as_asgi()),
]
