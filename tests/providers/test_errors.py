"""The retryable-or-fatal taxonomy, as functions and end to end through both SDK clients."""

from __future__ import annotations

import asyncio
import email.utils
import socket
import time

import pytest

from runtime.agents import ProviderConfig
from runtime.domain.model import Message
from runtime.providers import errors
from runtime.providers.anthropic_provider import AnthropicProvider
from runtime.providers.base import InferenceRequest, ModelError
from runtime.providers.openai_compat import OpenAIProvider
from tests.providers.replay import Reply, infer

ASK = InferenceRequest(model="m", instructions="", messages=(Message(role="user", content="hi"),))


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-3"}, 0.0),
        ({}, None),
        (None, None),
    ],
)
def test_retry_after(headers, expected) -> None:
    assert errors.retry_after(headers) == expected


def test_retry_after_as_an_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    delay = errors.retry_after({"retry-after": when})
    assert delay is not None and 25 <= delay <= 31


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"error": {"message": "Bad thing", "type": "invalid_request_error", "code": "bad"}},
            "bad: Bad thing",
        ),
        ({"message": "inner only", "type": "server_error"}, "server_error: inner only"),
        (
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            "overloaded_error: Overloaded",
        ),
        (
            {
                "error": {
                    "code": 429,
                    "message": "Provider returned error",
                    "metadata": {"raw": "slow down"},
                }
            },
            "Provider returned error: slow down",
        ),
        ("upstream connect error", "upstream connect error"),
        (None, ""),
    ],
)
def test_error_detail(body, expected) -> None:
    assert errors.error_detail(body) == expected


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (401, False),
        (402, False),
        (403, False),
        (404, False),
        (408, True),
        (409, True),
        (413, False),
        (422, False),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (529, True),
    ],
)
def test_status_taxonomy(status, retryable) -> None:
    error = errors.from_status("openai", status, {"error": {"message": "m"}}, {})
    assert (error.retryable, error.status) == (retryable, status)


def test_x_should_retry_overrides_the_status() -> None:
    assert errors.from_status("p", 500, None, {"x-should-retry": "false"}).retryable is False
    assert errors.from_status("p", 400, None, {"x-should-retry": "true"}).retryable is True


STATUS_CASES = [
    (400, {}, False, None),
    (401, {}, False, None),
    (403, {}, False, None),
    (404, {}, False, None),
    (429, {"retry-after": "3"}, True, 3.0),
    (429, {}, True, None),
    (500, {}, True, None),
    (503, {"retry-after": "2"}, True, 2.0),
    (529, {}, True, None),
]


@pytest.mark.parametrize(("status", "headers", "retryable", "retry_after"), STATUS_CASES)
def test_openai_status_end_to_end(
    server, openai_provider, context, status, headers, retryable, retry_after
) -> None:
    body = {"error": {"message": f"synthetic {status}", "type": "t", "code": "c"}}
    server.queue(Reply.json(status, body, headers))
    ctx, _ = context()
    with pytest.raises(ModelError) as caught:
        infer(openai_provider(), ASK, ctx)
    error = caught.value
    assert (error.provider, error.status, error.retryable) == ("openai", status, retryable)
    assert error.retry_after == retry_after
    assert f"synthetic {status}" in error.message
    assert error.as_error()["status"] == status


@pytest.mark.parametrize(("status", "headers", "retryable", "retry_after"), STATUS_CASES)
def test_anthropic_status_end_to_end(
    server, anthropic_provider, context, status, headers, retryable, retry_after
) -> None:
    body = {"type": "error", "error": {"type": "some_error", "message": f"synthetic {status}"}}
    server.queue(Reply.json(status, body, {**headers, "request-id": "req_abc"}))
    ctx, _ = context()
    with pytest.raises(ModelError) as caught:
        infer(anthropic_provider(), ASK, ctx)
    error = caught.value
    assert (error.provider, error.status, error.retryable) == ("anthropic", status, retryable)
    assert error.retry_after == retry_after
    assert f"synthetic {status}" in error.message
    assert "req_abc" in error.message


def test_plain_text_error_body(server, openai_provider, context) -> None:
    server.queue(
        Reply(status=502, headers={"content-type": "text/plain"}, body=b"Bad Gateway from nginx")
    )
    ctx, _ = context()
    with pytest.raises(ModelError) as caught:
        infer(openai_provider(), ASK, ctx)
    assert (caught.value.status, caught.value.retryable) == (502, True)
    assert "Bad Gateway from nginx" in caught.value.message


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_connection_refused_is_retryable(kind, context) -> None:
    port = closed_port()
    provider: OpenAIProvider | AnthropicProvider
    if kind == "openai":
        provider = OpenAIProvider(
            ProviderConfig(
                kind="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1", timeout=2
            )
        )
    else:
        provider = AnthropicProvider(
            ProviderConfig(
                kind="anthropic", model="m", base_url=f"http://127.0.0.1:{port}", timeout=2
            )
        )
    ctx, _ = context()
    try:
        with pytest.raises(ModelError) as caught:
            infer(provider, ASK, ctx)
    finally:
        asyncio.run(provider.close())
    assert (caught.value.retryable, caught.value.status) == (True, None)
    assert "the connection failed" in caught.value.message


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_no_answer_within_the_timeout_is_retryable(
    kind, server, openai_provider, anthropic_provider, context
) -> None:
    server.queue(Reply(stall_after=0))
    provider = (openai_provider if kind == "openai" else anthropic_provider)(timeout=0.3)
    ctx, _ = context()
    with pytest.raises(ModelError) as caught:
        infer(provider, ASK, ctx)
    assert caught.value.retryable is True
    assert "timed out" in caught.value.message


OPENAI_STALL = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]}\n\n'
    b'data: {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}\n\n'
)
ANTHROPIC_STALL = (
    b'event: message_start\ndata: {"type": "message_start", "message": {"id": "m", "type": '
    b'"message", "role": "assistant", "model": "m", "content": [], "stop_reason": null, '
    b'"usage": {"input_tokens": 1, "output_tokens": 1}}}\n\n'
    b'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
    b'"content_block": {"type": "text", "text": ""}}\n\n'
)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_stream_that_stalls_is_retryable(
    kind, server, openai_provider, anthropic_provider, context
) -> None:
    body = OPENAI_STALL if kind == "openai" else ANTHROPIC_STALL
    first_event = body.index(b"\n\n") + 2
    server.queue(
        Reply(
            headers={"content-type": "text/event-stream"},
            body=body,
            framing="chunked",
            split=True,
            stall_after=first_event,
        )
    )
    provider = (openai_provider if kind == "openai" else anthropic_provider)(timeout=0.3)
    ctx, recorded = context()
    with pytest.raises(ModelError) as caught:
        infer(provider, ASK, ctx)
    assert caught.value.retryable is True
    assert "stalled past the timeout" in caught.value.message
    if kind == "openai":
        assert recorded.text == "Hel"  # what arrived before the stall was published live
