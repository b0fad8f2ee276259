"""The one NinjaAPI of ``/api/v1/``: its routers, its security scheme and its error handlers."""

from __future__ import annotations

from ninja import NinjaAPI

from console.api import errors, events, runs, threads, tickets, tool_calls

api = NinjaAPI(
    title="Durable agent runtime API",
    version="1",
    description=(
        "Start runs, read their committed state and log, answer their tickets, cancel them "
        "and reconcile Indeterminate tool calls. Authenticate with a personal API token "
        "(`Authorization: Bearer rt_...`, from `manage.py runtime_token USERNAME` or the "
        'console). Every error is `{"error": {"code", "message", "detail"}}`.'
    ),
    urls_namespace="api_v1",
)
errors.install(api)
api.add_router("/threads", threads.router)
api.add_router("/runs", runs.router)
api.add_router("/runs", events.router)
api.add_router("/tickets", tickets.router)
api.add_router("/tool-calls", tool_calls.router)
