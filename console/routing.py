"""WebSocket routes of the console (wired into ``console.asgi``)."""

from __future__ import annotations

from django.urls import path

from console import consumers

websocket_urlpatterns = [
    path("ws/runs/", consumers.RunsConsumer.as_asgi()),
    path("ws/runs/<str:run_id>/", consumers.RunConsumer.as_asgi()),
]
