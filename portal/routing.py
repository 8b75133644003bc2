"""WebSocket routes of all apps, collected in one list for the ASGI router."""

from __future__ import annotations

from typing import Any

# Apps append their consumers here as they gain live streams (serving: /ws/gpu/, incidents).
websocket_urlpatterns: list[Any] = []

from incidents.routing import websocket_urlpatterns as incidents_websockets  # noqa: E402

websocket_urlpatterns += incidents_websockets

from serving.telemetry.routing import websocket_urlpatterns as serving_websockets  # noqa: E402

websocket_urlpatterns += serving_websockets
