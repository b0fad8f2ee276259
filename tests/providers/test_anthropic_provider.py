"""The Anthropic provider: request mapping, and synthetic Messages streams over loopback HTTP."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from runtime.domain.model import Message
from runtime.providers import errors
from runtime.providers.anthropic_provider import DEFAULT_MAX_TOKENS, request_body, tool_input
from runtime.providers.base import InferenceRequest, ModelError, ToolSpec
from tests.providers.replay import Reply
from tests.providers.replay import infer as run_inference

ASK = InferenceRequest(model="m", instructions="", messages=(Message(role="user", content="hi"),))


def events(*items: dict[str, Any], **reply: Any) -> Reply:
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in items)
    return Reply(headers={"content-type": "text/event-stream"}, body=body.encode(), **reply)


def start(input_tokens: int = 5) -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return {"type": "message_start", "message": message}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, d: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": d}


def stop_block(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason: str | None, output_tokens: int = 9) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


STOP = {"type": "message_stop"}


def text_message(text: str, stop_reason: str = "end_turn") -> list[dict[str, Any]]:
    return [
        start(),
        block_start(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": text}),
        stop_block(0),
        message_delta(stop_reason),
        STOP,
    ]


def infer(server, provider, context, reply: Reply, request=ASK, **ctx_options):
    server.queue(reply)
    ctx, recorded = context(**ctx_options)
    return run_inference(provider, request, ctx), recorded


# --- the request ---------------------------------------------------------------------


CONVERSATION = InferenceRequest(
    model="claude-test",
    instructions="Be brief.",
    messages=(
        Message(role="system", content="The user is in Europe."),
        Message(role="user", content="Weather in Oslo and Rome?"),
        Message(
            role="assistant",
            content="Looking.",
            tool_calls=(
                {"id": "toolu_1", "name": "weather", "arguments": '{"city": "Oslo"}'},
                {"id": "toolu_2", "name": "weather", "arguments": ""},
                {"id": "toolu_3", "name": "weather", "arguments": '{"city": "Ro'},
            ),
        ),
        Message(role="tool", content="rain", tool_call_id="toolu_1", name="weather"),
        Message(role="tool", content="sun", tool_call_id="toolu_2", name="weather"),
        Message(
            role="tool",
            content="arguments are not valid JSON",
            tool_call_id="toolu_3",
            name="weather",
            meta={"is_error": True},
        ),
        Message(role="assistant", content=""),
        Message(role="user", content="Thanks"),
    ),
    tools=(
        ToolSpec(
            name="weather",
            description="Weather now.",
            parameters={"type": "object", "properties": {"city": {"type": "string"}}},
        ),
        ToolSpec(name="clock", description="", parameters={"type": "object", "properties": {}}),
    ),
    options={"temperature": 0, "stream": False, "system": "ignored"},
)


def test_request_body_maps_every_role() -> None:
    assert request_body(CONVERSATION, {"top_k": 5}) == {
        "model": "claude-test",
        "max_tokens": DEFAULT_MAX_TOKENS,
        "messages": [
            {"role": "user", "content": "Weather in Oslo and Rome?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "weather",
                        "input": {"city": "Oslo"},
                    },
                    {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}},
                    {
                        "type": "tool_use",
                        "id": "toolu_3",
                        "name": "weather",
                        "input": {"_unparsed_arguments": '{"city": "Ro'},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "sun"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_3",
                        "content": "arguments are not valid JSON",
                        "is_error": True,
                    },
                ],
            },
            {"role": "user", "content": "Thanks"},
        ],
        "system": "Be brief.\n\nThe user is in Europe.",
        "tools": [
            {
                "name": "weather",
                "description": "Weather now.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
            {"name": "clock", "input_schema": {"type": "object", "properties": {}}},
        ],
        "stream": True,
        "temperature": 0,
        "top_k": 5,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("", {}),
        ("   ", {}),
        ("[1, 2]", {"_unparsed_arguments": "[1, 2]"}),
        ('{"a": ', {"_unparsed_arguments": '{"a": '}),
    ],
)
def test_tool_input_from_committed_text(text, expected) -> None:
    assert tool_input(text) == expected


def test_the_sdk_sends_the_mapped_body(server, anthropic_provider, context) -> None:
    infer(server, anthropic_provider(), context, events(*text_message("ok")), CONVERSATION)
    (seen,) = server.seen
    assert seen.body == request_body(CONVERSATION)
    assert seen.path == "/v1/messages"
    assert seen.headers["anthropic-version"]


def test_api_key_header(server, anthropic_provider, context, monkeypatch) -> None:
    monkeypatch.setenv("H6_ANTHROPIC_KEY", "sk-ant-test")
    infer(
        server,
        anthropic_provider(api_key_env="H6_ANTHROPIC_KEY"),
        context,
        events(*text_message("ok")),
    )
    headers = server.seen[0].headers
    # anthropic 2.x sends the key as a bearer token; older SDKs used x-api-key.
    assert "sk-ant-test" in (headers.get("x-api-key"), headers.get("authorization", "")[7:])


def test_max_tokens_from_options(server, anthropic_provider, context) -> None:
    infer(
        server, anthropic_provider(options={"max_tokens": 99}), context, events(*text_message("ok"))
    )
    assert server.seen[0].body["max_tokens"] == 99


# --- streams -------------------------------------------------------------------------


def test_text_stream(server, anthropic_provider, context) -> None:
    result, recorded = infer(
        server,
        anthropic_provider(),
        context,
        events(*text_message("Hello"), split=True, framing="chunked"),
    )
    assert (result.text, result.finish_reason) == ("Hello", "stop")
    assert dict(result.usage) == {"input_tokens": 5, "output_tokens": 9}
    assert recorded.text == "Hello"


def test_tool_input_whole_in_block_start(server, anthropic_provider, context) -> None:
    """A compatible server may send the whole ``input`` in content_block_start, no deltas."""
    reply = events(
        start(),
        block_start(0, {"type": "tool_use", "id": "toolu_x", "name": "f", "input": {"k": [1, 2]}}),
        stop_block(0),
        message_delta("tool_use"),
        STOP,
    )
    result, recorded = infer(server, anthropic_provider(), context, reply)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("toolu_x", "f", {"k": [1, 2]})
    ]
    assert recorded.calls()[0]["arguments"] == result.tool_calls[0].arguments


def test_tool_with_no_input_has_empty_object(server, anthropic_provider, context) -> None:
    reply = events(
        start(),
        block_start(0, {"type": "tool_use", "id": "toolu_y", "name": "now", "input": {}}),
        delta(0, {"type": "input_json_delta", "partial_json": ""}),
        stop_block(0),
        message_delta("tool_use"),
        STOP,
    )
    result, _ = infer(server, anthropic_provider(), context, reply)
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("now", "{}")]


def test_thinking_blocks_are_not_text(server, anthropic_provider, context) -> None:
    reply = events(
        start(),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Let me think"}),
        delta(0, {"type": "signature_delta", "signature": "sig"}),
        stop_block(0),
        block_start(1, {"type": "text", "text": ""}),
        delta(1, {"type": "text_delta", "text": "Answer"}),
        stop_block(1),
        message_delta("end_turn"),
        STOP,
    )
    result, recorded = infer(server, anthropic_provider(), context, reply)
    assert result.text == "Answer"
    assert [d.text for d in recorded.deltas] == ["Answer"]


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
    ],
)
def test_stop_reasons(server, anthropic_provider, context, wire, expected) -> None:
    result, _ = infer(server, anthropic_provider(), context, events(*text_message("x", wire)))
    assert result.finish_reason == expected


def test_missing_message_stop_is_incomplete(server, anthropic_provider, context) -> None:
    reply = events(*text_message("partial")[:3], framing="close")
    with pytest.raises(ModelError) as caught:
        infer(server, anthropic_provider(), context, reply)
    assert caught.value.retryable is True
    assert "incomplete stream" in caught.value.message


def test_stop_reason_without_message_stop_is_complete(server, anthropic_provider, context) -> None:
    reply = events(*text_message("whole")[:-1], framing="close")
    result, _ = infer(server, anthropic_provider(), context, reply)
    assert (result.text, result.finish_reason) == ("whole", "stop")


def test_overloaded_error_event_mid_stream_is_retryable(
    server, anthropic_provider, context
) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    reply = events(*text_message("par")[:3], error, split=True, framing="chunked")
    with pytest.raises(ModelError) as caught:
        infer(server, anthropic_provider(), context, reply)
    assert (caught.value.retryable, caught.value.status) == (True, None)
    assert "overloaded_error: Overloaded" in caught.value.message


def test_authentication_error_event_is_fatal(server, anthropic_provider, context) -> None:
    error = {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}}
    with pytest.raises(ModelError) as caught:
        infer(server, anthropic_provider(), context, events(start(), error))
    assert caught.value.retryable is False
    assert "bad key" in caught.value.message


def test_json_answer_to_a_stream_request_is_malformed(server, anthropic_provider, context) -> None:
    message = {"id": "m", "type": "message", "role": "assistant", "content": [], "model": "m"}
    with pytest.raises(ModelError) as caught:
        infer(server, anthropic_provider(), context, Reply.json(200, message))
    assert caught.value.retryable is False
    assert "malformed response" in caught.value.message


def test_non_json_event_data_is_malformed(server, anthropic_provider, context) -> None:
    body = b"event: message_start\ndata: {oops\n\n"
    reply = Reply(headers={"content-type": "text/event-stream"}, body=body)
    with pytest.raises(ModelError) as caught:
        infer(server, anthropic_provider(), context, reply)
    assert caught.value.retryable is False
    assert "not JSON" in caught.value.message


def test_a_cut_stream_is_named_so_whichever_error_the_sdk_raises(
    server, anthropic_provider, context
) -> None:
    """SDK quirk: older anthropic clients let the transport's ``RemoteProtocolError`` out of a
    cut stream, current ones wrap it as ``APIConnectionError``; both read as a cut stream."""
    full = events(*text_message("a long answer"))
    reply = events(
        *text_message("a long answer"), framing="chunked", split=True, cut_after=len(full.body) - 40
    )
    with pytest.raises(ModelError) as caught:
        infer(server, anthropic_provider(), context, reply)
    assert caught.value.retryable is True
    assert "the stream was cut mid-way" in caught.value.message
    cause = caught.value.__cause__
    assert isinstance(cause, (anthropic.APIConnectionError, *errors.transport_errors())), cause
    assert not isinstance(cause, anthropic.APITimeoutError), cause
