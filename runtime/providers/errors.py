"""How a provider failure becomes a ``ModelError``: the one retryable-or-fatal taxonomy.

Retryable (the loop backs off and asks again within its budget): a connection that fails or
drops, a timeout, a stream that stops before the model finished, HTTP 408, 409, 429 and 5xx,
and an error event sent mid-stream after the server accepted the request with 200. Fatal (the
run fails with this error): every other 4xx (400, 401, 403, 404, 413, 422, ...) and a response
that cannot be read as the protocol says. ``x-should-retry: true|false`` from the server
overrides the status rule, as both official SDKs do. ``retry_after`` comes from
``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), whatever the status.

The message always carries what the server said (its ``error.message``, code and request id),
so an operator reading a failed run sees the provider's own words.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from runtime.providers.base import ModelError

RETRYABLE_STATUSES = frozenset({408, 409, 429})

# Error types that no retry can fix, even when they arrive mid-stream.
FATAL_ERROR_TYPES = frozenset(
    {
        "authentication_error",
        "permission_error",
        "permission_denied",
        "not_found_error",
        "invalid_api_key",
        "billing_error",
        "insufficient_quota",
    }
)


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's transport exceptions (connection lost, read timeout, bad framing).

    The SDKs wrap these while sending a request, but not always while a body is read: the
    anthropic SDK lets ``httpx2.RemoteProtocolError`` escape from a stream cut mid-way, and a
    body read through ``iter_lines`` is never wrapped. Both ``httpx2`` (current SDKs) and
    ``httpx`` (older ones) are covered.
    """
    found: list[type[BaseException]] = []
    for module_name in ("httpx2", "httpx"):
        try:
            module = __import__(module_name)
        except ImportError:
            continue
        found.append(module.TransportError)
    return tuple(found)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asks to wait: ``retry-after-ms``, then ``retry-after``; else None."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_object(body: Any) -> Any:
    if isinstance(body, Mapping) and "error" in body:
        return body["error"]
    return body


def error_detail(body: Any) -> str:
    """The server's own words from an error body: ``code: message`` (and upstream detail).

    Copes with OpenAI ``{"error": {"message", "type", "code"}}`` (or the inner object the
    openai SDK keeps), Anthropic ``{"type": "error", "error": {"type", "message"}}``,
    OpenRouter's integer codes and ``metadata.raw``, and plain-text bodies.
    """
    error = _error_object(body)
    if isinstance(error, str):
        return error.strip()[:2000]
    if not isinstance(error, Mapping):
        return "" if error is None else str(error)[:2000]
    message = error.get("message")
    text = message.strip() if isinstance(message, str) else ""
    metadata = error.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("raw"), str):
        text = f"{text}: {metadata['raw']}" if text else metadata["raw"]
    label = error.get("code") or error.get("type")
    if isinstance(label, int):  # OpenRouter's integer code only repeats the HTTP status
        label = error.get("type")
    if label is not None and str(label) not in text:
        text = f"{label}: {text}" if text else str(label)
    return text[:2000]


def error_type(body: Any) -> str | None:
    error = _error_object(body)
    if isinstance(error, Mapping):
        for key in ("type", "code"):
            if isinstance(error.get(key), str):
                return error[key]
    return None


def from_status(
    provider: str,
    status: int,
    body: Any,
    headers: Mapping[str, str] | None,
    *,
    request_id: str | None = None,
) -> ModelError:
    """Classify an HTTP error response by its status (and ``x-should-retry``)."""
    retryable = status in RETRYABLE_STATUSES or status >= 500
    should_retry = (headers or {}).get("x-should-retry")
    if should_retry == "true":
        retryable = True
    elif should_retry == "false":
        retryable = False
    detail = error_detail(body) or "no error message in the response body"
    suffix = f" (request {request_id})" if request_id else ""
    return ModelError(
        f"{provider}: HTTP {status}: {detail}{suffix}",
        provider=provider,
        retryable=retryable,
        status=status,
        retry_after=retry_after(headers),
    )


def midstream(provider: str, body: Any) -> ModelError:
    """Classify an error event sent after the server answered 200 and began streaming.

    The request was accepted, so the failure belongs to this generation (overloaded, a
    malformed tool call the model produced, an upstream hiccup) and another attempt may
    succeed: retryable, unless the error's type says no retry can help (authentication,
    permission, not found, billing).
    """
    kind = error_type(body)
    detail = error_detail(body) or "an error event without a message"
    return ModelError(
        f"{provider}: error event mid-stream: {detail}",
        provider=provider,
        retryable=kind not in FATAL_ERROR_TYPES,
    )


def connection(
    provider: str, exc: BaseException, *, mid_stream: bool = False, url: str | None = None
) -> ModelError:
    """A transport failure or a timeout: retryable. Mid-stream it means the stream was cut.

    ``url`` (the base URL tried) is named in the message, so a wrong address is plain to see.
    """
    timed_out = "Timeout" in type(exc).__name__
    if mid_stream:
        where = "the stream stalled past the timeout" if timed_out else "the stream was cut mid-way"
    else:
        where = "the request timed out" if timed_out else "the connection failed"
    if url:
        where = f"{where} ({url})"
    cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ModelError(f"{provider}: {where}: {cause}", provider=provider, retryable=True)


def incomplete(provider: str, why: str) -> ModelError:
    """The stream ended cleanly but before the model finished: retryable."""
    return ModelError(f"{provider}: incomplete stream: {why}", provider=provider, retryable=True)


def malformed(provider: str, why: str) -> ModelError:
    """The server answered with something the protocol does not allow: fatal."""
    return ModelError(f"{provider}: malformed response: {why}", provider=provider, retryable=False)
