"""What the console answers when the database cannot serve a request: a plain 503 page.

``runtime.db.unavailable`` decides what counts (an unreachable database, no pooled connection
in time, a statement or lock timeout, a lost connection, a locked SQLite file); the API answers
the same faults with its JSON error (console.api.errors). A view's fault is caught by the
middleware, quietly (one warning line); a fault anywhere else in the chain (a session saved on
the way out) reaches Django's 500 handler, which answers the same 503.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.views import defaults

from console.api.errors import fault_response
from console.api.mount import is_api_path
from runtime import db
from runtime.errors import DatabaseUnavailable

log = logging.getLogger("console")


def page(timeout: str | None = None) -> HttpResponse:
    """The 503 page, with Retry-After, naming the ``timeout`` ("statement" or "lock") that
    cancelled the request's statement if one did; it reads nothing from the database."""
    response = HttpResponse(render_to_string("console/503.html", {"timeout": timeout}), status=503)
    response["Retry-After"] = str(DatabaseUnavailable.retry_after)
    return response


def answer(request: HttpRequest, exc: BaseException | None = None) -> HttpResponse:
    """The 503 for ``request`` (``exc``: the fault, naming the timeout that cancelled its
    statement if one did): the API's JSON error under the API's prefix, the page elsewhere."""
    which = db.timed_out(exc) if exc is not None else None
    if is_api_path(request.path):
        return fault_response(DatabaseUnavailable.timed_out(which))
    return page(which)


class DatabaseUnavailableMiddleware:
    """Answer a view that found the database unavailable with ``answer()``, not a 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not db.unavailable(exception):
            return None
        log.warning("database unavailable in %s %s: %s", request.method, request.path, exception)
        return answer(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's 500 handler (``handler500``): the 503 answer when what failed was the
    database (the API's JSON error under the API's prefix), Django's own 500 page otherwise."""
    exc = sys.exception() or Exception()
    if not db.unavailable(exc):
        return defaults.server_error(request)
    return answer(request, exc)
