"""The one NinjaAPI of ``/api/v1/``: its routers, its security scheme, its error handlers and
how it reads a request's body and query string."""

from __future__ import annotations

import codecs
from typing import Any

from django.http import HttpRequest
from django.utils.datastructures import MultiValueDict
from ninja import NinjaAPI
from ninja.errors import ValidationError
from ninja.parser import Parser

from console.api import errors, events, limits, runs, threads, tickets, tool_calls, webhooks
from runtime.untrusted import text_problem

# Byte order marks, longest first (UTF-32 LE's begins with UTF-16 LE's).
BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32LE with a byte order mark"),
    (codecs.BOM_UTF32_BE, "UTF-32BE with a byte order mark"),
    (codecs.BOM_UTF8, "UTF-8 with a byte order mark"),
    (codecs.BOM_UTF16_LE, "UTF-16LE with a byte order mark"),
    (codecs.BOM_UTF16_BE, "UTF-16BE with a byte order mark"),
)


def not_utf8(body: bytes) -> str | None:
    """What ``body`` is encoded as when it is not UTF-8 without a byte order mark, which JSON
    must be (RFC 8259 §8.1), or None. A JSON text begins with an ASCII character, so a NUL
    among its first four bytes means UTF-16 or UTF-32 (RFC 4627 §3)."""
    for bom, name in BOMS:
        if body.startswith(bom):
            return name
    if b"\x00" in body[:4]:
        return "UTF-16 or UTF-32"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 (byte {exc.start})"
    return None


class JsonBodies(Parser):
    """Read a request body only when it says it is JSON (``application/json`` or a
    ``+json`` type, any parameters): a form, a multipart body, text or a body without a
    Content-Type is refused with UnsupportedMediaType (415) before it is parsed. JSON in
    UTF-16, UTF-32, another encoding or behind a byte order mark is refused with
    InvalidEncoding (400, like any body that is not a JSON text), naming what it is. The one
    rule of every operation's body; a request without a body (a GET, a cancel without a
    reason) never gets here.

    Read a query string only when every name and value in it is text the databases can store
    (``runtime.untrusted.text_problem``: no NUL, which PostgreSQL refuses in any statement):
    otherwise a ValidationError (422 ``validation_error``) names each such parameter
    (``loc: ["query", name]``), for every operation that reads its query string, before the
    operation reads any parameter."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        media_type = (request.content_type or "").lower()
        if media_type != "application/json" and not media_type.endswith("+json"):
            raise errors.UnsupportedMediaType(content_type=request.content_type or None)
        if found := not_utf8(request.body):
            raise errors.InvalidEncoding(
                f"a JSON body is UTF-8 without a byte order mark (RFC 8259 §8.1); this one is "
                f"{found}",
                encoding=found,
            )
        return super().parse_body(request)

    def parse_querydict(
        self, data: MultiValueDict[str, Any], list_fields: list[str], request: HttpRequest
    ) -> dict[str, Any]:
        refused = []
        for name, values in data.lists():
            problems = (text_problem(text) for text in (name, *values))
            if (problem := next((p for p in problems if p is not None), None)) is not None:
                refused.append({"type": "unstorable_text", "loc": ["query", name], "msg": problem})
        if refused:
            raise ValidationError(refused)
        return super().parse_querydict(data, list_fields, request)


api = NinjaAPI(
    title="Durable agent runtime API",
    version="1",
    description=(
        "Start runs, read their committed state and log, answer their tickets, cancel them "
        "and reconcile Indeterminate tool calls, and manage outgoing webhooks. Authenticate "
        "with a personal API token "
        "(`Authorization: Bearer rt_...`, from `manage.py runtime_token USERNAME` or the "
        'console). Every error is `{"error": {"code", "message", "detail"}}`. Request '
        "bodies are JSON, sent with `Content-Type: application/json` (anything else is 415), "
        "in UTF-8 without a byte order mark (anything else is 400 `invalid_encoding`)."
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
