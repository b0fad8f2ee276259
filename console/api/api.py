"""The one NinjaAPI of ``/api/v1/``: its routers, its security scheme, its error handlers and
how it reads a request body."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.parser import Parser

from console.api import errors, events, limits, runs, threads, tickets, tool_calls, webhooks


class JsonBodies(Parser):
    """Read a request body only when it says it is JSON (``application/json`` or a
    ``+json`` type, any parameters): a form, a multipart body, text or a body without a
    Content-Type is refused with UnsupportedMediaType (415) before it is parsed. A request
    without a body (a GET, a cancel without a reason) never gets here."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        media_type = (request.content_type or "").lower()
        if media_type != "application/json" and not media_type.endswith("+json"):
            raise errors.UnsupportedMediaType(content_type=request.content_type or None)
        return super().parse_body(request)


api = NinjaAPI(
    title="Durable agent runtime API",
    version="1",
    description=(
        "Start runs, read their committed state and log, answer their tickets, cancel them "
        "and reconcile Indeterminate tool calls, and manage outgoing webhooks. Authenticate "
        "with a personal API token "
        "(`Authorization: Bearer rt_...`, from `manage.py runtime_token USERNAME` or the "
        'console). Every error is `{"error": {"code", "message", "detail"}}`. Request '
        "bodies are JSON, sent with `Content-Type: application/json` (anything else is 415)."
    ),
    urls_namespace="api_v1",
    parser=JsonBodies(),
)
errors.install(api)
api.add_router("/threads", threads.router)
api.add_router("/runs", runs.router)
api.add_router("/runs", events.router)
api.add_router("/tickets", tickets.router)
api.add_router("/tool-calls", tool_calls.router)
api.add_router("/limits", limits.router)
api.add_router("/webhooks", webhooks.router)
