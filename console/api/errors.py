"""Every error the API returns, in one shape: ``{"error": {"code", "message", "detail"}}``.

The runtime's typed faults (``RuntimeFault``: ``.code``, ``.status``, ``.message``,
``.detail``) and the API's own refusals map to responses here, once; django-ninja's validation
errors, HTTP errors and 404s, unknown paths, wrong methods and unexpected exceptions too, so a
client never sees another error shape. A database that cannot serve the request (unreachable,
no pooled connection in time, a statement or lock timeout) is 503 ``database_unavailable``
with ``Retry-After``, never a 500; a command committed before something failed is 202 with
its commit (``CommittedOut``), never an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from console.api.mount import docs_url, is_api_path
from console.api.schemas import CommittedOut, ErrorOut
from runtime import db
from runtime.errors import CommittedUnread, DatabaseUnavailable, RuntimeFault

log = logging.getLogger("console.api")

HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    422: "validation_error",
    429: "throttled",
}


class Unauthorized(RuntimeFault):
    """A valid personal API token is required (Authorization: Bearer <token>)."""

    code = "unauthorized"
    status = 401


class Forbidden(RuntimeFault):
    """The token's user lacks the permission this operation needs."""

    code = "forbidden"
    status = 403


class InvalidCursor(RuntimeFault):
    """The pagination cursor is not one this API issued."""

    code = "invalid_cursor"
    status = 422


class UnsupportedMediaType(RuntimeFault):
    """A request body is JSON, sent with Content-Type: application/json."""

    code = "unsupported_media_type"
    status = 415


class InvalidEncoding(RuntimeFault):
    """A JSON body is UTF-8 without a byte order mark (RFC 8259 §8.1)."""

    code = "invalid_encoding"
    status = 400


def error_body(code: str, message: str, detail: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "detail": detail or {}}}


def error_response(
    status: int, code: str, message: str, detail: dict[str, Any] | None = None
) -> JsonResponse:
    return JsonResponse(error_body(code, message, detail), status=status)


def fault_response(fault: RuntimeFault) -> JsonResponse:
    response = error_response(fault.status, fault.code, fault.message, _jsonable(fault.detail))
    if fault.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    if fault.retry_after is not None:
        response["Retry-After"] = str(fault.retry_after)
    return response


def _jsonable(detail: dict[str, Any]) -> dict[str, Any]:
    """Make a fault's detail JSON-safe (details may hold enums or other plain values)."""
    return json.loads(json.dumps(detail, default=str))


def _body_relative(error: dict[str, Any]) -> dict[str, Any]:
    """A validation error whose ``loc`` leads from the body itself (``["body", "input"]``),
    without the name of the view's parameter that ninja puts second (``"payload"``)."""
    loc = list(error.get("loc", ()))
    if len(loc) >= 2 and loc[0] == "body":
        return {**error, "loc": [loc[0], *loc[2:]]}
    return error


def errors(*statuses: int) -> dict[int, type[ErrorOut]]:
    """The documented error responses of an operation: ``{status: ErrorOut}``, with the 503
    that any operation answers when the database cannot serve it."""
    return dict.fromkeys((*statuses, 503), ErrorOut)


def install(api: NinjaAPI) -> None:
    """Register the API's exception handlers (once, for every router)."""

    @api.exception_handler(RuntimeFault)
    def on_fault(request: HttpRequest, exc: RuntimeFault) -> HttpResponse:
        return fault_response(exc)

    @api.exception_handler(ValidationError)
    def on_validation(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        return error_response(
            422,
            "validation_error",
            "the request does not match the schema",
            _jsonable({"errors": [_body_relative(error) for error in exc.errors]}),
        )

    @api.exception_handler(AuthenticationError)
    def on_authentication(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return fault_response(Unauthorized())

    @api.exception_handler(HttpError)
    def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        if isinstance(exc.__cause__, RuntimeFault):  # ninja wraps what the parser raised
            return fault_response(exc.__cause__)
        code = HTTP_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc))

    @api.exception_handler(Http404)
    def on_not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
        return error_response(404, "not_found", str(exc) or "not found")

    @api.exception_handler(RequestDataTooBig)
    def on_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return error_response(
            413, "payload_too_large", f"the request body is over {limit} bytes", {"limit": limit}
        )

    @api.exception_handler(CommittedUnread)
    def on_committed(request: HttpRequest, exc: CommittedUnread) -> HttpResponse:
        # The command took effect: never an error. Sending it again gets the run (200).
        body = CommittedOut(run_id=exc.run_id, seq=exc.seq, message=exc.message)
        return JsonResponse(body.model_dump(), status=202)

    @api.exception_handler(Exception)
    def on_exception(request: HttpRequest, exc: Exception) -> HttpResponse:
        if db.unavailable(exc):  # a fault of the database, not of the request: 503, retry
            log.warning("database unavailable in %s %s: %s", request.method, request.path, exc)
            return fault_response(DatabaseUnavailable.timed_out(db.timed_out(exc)))
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal_error", "internal server error")


def bad_request_view(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 400 handler (``handler400``): what Django refuses before any view runs (a
    Host header it does not serve, a multipart body it cannot parse) has the API's error
    shape under the API's prefix, and Django's own page elsewhere. The reason is not echoed:
    it may name settings."""
    if is_api_path(request.path):
        return malformed_request(request.path)
    return defaults.bad_request(request, exception)


def malformed_request(path: str) -> HttpResponse:
    """The 400 for a request to ``path`` that cannot be read: ``bad_request`` in the API's
    error shape under the API's prefix, a bare 400 (Django's own) elsewhere. Also for a
    request Django could not make at all (``console.asgi``), which no view or handler sees."""
    if is_api_path(path):
        return error_response(400, "bad_request", "the request is malformed")
    return HttpResponseBadRequest()


@csrf_exempt  # the API authenticates by token; a POST to no operation is a 404, not a 403 page
def not_found_view(request: HttpRequest, path: str = "") -> JsonResponse:
    """Answer any path under the API prefix that no operation serves, whatever the method."""
    return error_response(
        404, "not_found", f"no API operation at {request.path}", {"docs": docs_url()}
    )


def json_errors(view: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap one of ninja's URL views so that what it answers outside the exception handlers
    (its plain-text 405, the Http404 of its root URL) takes the API's error shape too."""

    def reshape(response: HttpResponse) -> HttpResponse:
        if response.status_code != 405 or response.get("Content-Type", "").startswith(
            "application/json"
        ):
            return response
        allowed = response.get("Allow", "")
        reshaped = error_response(
            405,
            "method_not_allowed",
            f"{allowed or 'another method'} only",
            {"allowed": [m.strip() for m in allowed.split(",") if m.strip()]},
        )
        reshaped["Allow"] = allowed
        return reshaped

    if iscoroutinefunction(view):

        async def async_wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            return reshape(await view(request, *args, **kwargs))

        wrapped: Callable[..., Any] = async_wrapped
    else:

        def sync_wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                return reshape(view(request, *args, **kwargs))
            except Http404:
                return not_found_view(request)

        wrapped = sync_wrapped
    wrapped.csrf_exempt = True  # type: ignore[attr-defined]  # ninja views are CSRF-exempt
    return wrapped
