"""Request ids: every request carries one, in its log lines and in its response.

A client's (or reverse proxy's) ``X-Request-ID`` is kept when it is a short token, so one id
follows a request through the proxy's logs and ours; otherwise a new one is made. The answer
carries it back in ``X-Request-ID``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

from runtime import logs

HEADER = "X-Request-ID"
# Printable, no spaces or quotes, so that it is safe in a plain log line and a header.
ACCEPTED = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def request_id_of(request: HttpRequest) -> str:
    """The request's id: its valid ``X-Request-ID`` header, else a new 32-hex-digit id."""
    given = request.headers.get(HEADER, "")
    return given if ACCEPTED.fullmatch(given) else uuid.uuid4().hex


@sync_and_async_middleware
def request_id(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Bind the request id to the log context around the view; echo it in the response."""
    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponse:
            rid = request_id_of(request)
            with logs.context(request_id=rid):
                response = await get_response(request)
            response[HEADER] = rid
            return response

        return middleware_async

    def middleware(request: HttpRequest) -> HttpResponse:
        rid = request_id_of(request)
        with logs.context(request_id=rid):
            response = get_response(request)
        response[HEADER] = rid
        return response

    return middleware
