"""WebSocket routes of the console: mounted by an ASGI router under the same prefix as the
console's pages (``console.views.urls``), e.g. at the root by this repository's
``console.asgi`` or under ``runtime/`` by a host (README, "Add it to your project").

``ws_path`` reverses them for the pages, which hand them to the JavaScript (data attributes):
no page or script writes a WebSocket path by hand.
"""

from __future__ import annotations

from django.urls import path, reverse

from console import consumers

websocket_urlpatterns = [
    path("ws/runs/", consumers.RunsConsumer.as_asgi(), name="runs_ws"),
    path("ws/runs/<str:run_id>/", consumers.RunConsumer.as_asgi(), name="run_ws"),
]
# So that ``reverse(..., urlconf="console.routing")`` reads the routes above.
urlpatterns = websocket_urlpatterns


def ws_path(name: str, *args: object) -> str:
    """The absolute path of WebSocket route ``name`` ("runs_ws" or "run_ws" with a run id):
    the console's root (``reverse("console:runs")``) followed by the route, as the ASGI
    router mounts ``websocket_urlpatterns`` under the console's prefix. Raises NoReverseMatch
    for an unknown name or arguments."""
    root = reverse("console:runs")
    return root + reverse(name, args=args, urlconf="console.routing").lstrip("/")
