"""WebSocket routes of the incidents app (collected by portal.routing)."""

from __future__ import annotations

from django.urls import path

from incidents.consumers import IncidentsConsumer

websocket_urlpatterns = [
    path("ws/incidents/", IncidentsConsumer.as_asgi()),
]
