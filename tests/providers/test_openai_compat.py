"""The OpenAI-compatible provider against synthetic streams that reproduce server differences.

Each quirk is served over loopback HTTP to the real ``openai`` client, so the SDK's request
path, status handling and our SSE reading are all exercised.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.domain.model import Message
from runtime.providers.base import InferenceRequest, ModelError, ToolSpec
from runtime.providers.openai_compat import request_body
from tests.providers.replay import Reply
from tests.providers.replay import infer as run_inference

ASK = InferenceRequest(model="m", instructions="", messages=(Message(role="user", content="hi"),))


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    *,
    index: int = 0,
    usage: dict[str, Any] | None = None,
    no_choices: bool = False,
) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m"}
    body["choices"] = (
        [] if no_choices else [{"index": index, "delta": delta or {}, "finish_reason": finish}]
    )
    if usage is not None:
        body["usage"] = usage
    return body


def call(
    index: int | None = None, id: str | None = None, name: str | None = None, args: Any = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if index is not None:
        out["index"] = index
    if id is not None:
        out["id"], out["type"] = id, "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    out["function"] = function
    return out


def infer(server, provider, context, reply: Reply, request=ASK, **ctx_options):
    server.queue(reply)
    ctx, recorded = context(**ctx_options)
    return run_inference(provider, request, ctx), recorded


# --- chunks and deltas ---------------------------------------------------------------


def test_role_only_null_and_empty_content_chunks(server, openai_provider, context) -> None:
    """vLLM opens with role only; OpenAI sends content null or ""; none of them is text."""
    reply = Reply.sse(
        [
            chunk({"role": "assistant"}),
            chunk({"role": "assistant", "content": None, "refusal": None}),
            chunk({"content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            chunk({}, "stop"),
        ],
        split=True,
        framing="chunked",
    )
    result, recorded = infer(server, openai_provider(), context, reply)
    assert (result.text, result.finish_reason, result.tool_calls) == ("Hello", "stop", ())
    assert [d.text for d in recorded.deltas] == ["Hel", "lo"]


def test_usage_chunk_with_empty_choices(server, openai_provider, context) -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    reply = Reply.sse(
        [chunk({"content": "ok"}), chunk({}, "stop"), chunk(no_choices=True, usage=usage)]
    )
    result, _ = infer(server, openai_provider(), context, reply)
    assert result.text == "ok"
    assert dict(result.usage) == {"input_tokens": 11, "output_tokens": 3}


def test_missing_call_ids_become_deterministic(server, openai_provider, context) -> None:
    reply = Reply.sse(
        [
            chunk({"tool_calls": [call(0, name="a", args='{"x":')]}),
            chunk({"tool_calls": [call(0, args="1}")]}),
            chunk({"tool_calls": [call(1, name="b", args="{}")]}),
            chunk({}, "tool_calls"),
        ]
    )
    result, recorded = infer(server, openai_provider(), context, reply, step=3)
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_3_0", "a", '{"x":1}'),
        ("call_3_1", "b", "{}"),
    ]
    assert [c["id"] for c in recorded.calls()] == ["call_3_0", "call_3_1"]


def test_duplicate_call_ids_are_made_unique(server, openai_provider, context) -> None:
    """Two calls of one response must not share an id: results are matched by it."""
    reply = Reply.sse(
        [
            chunk({"tool_calls": [call(0, id="call_0", name="a", args="{}")]}),
            chunk({"tool_calls": [call(1, id="call_0", name="b", args="{}")]}),
            chunk({}, "tool_calls"),
        ]
    )
    result, _ = infer(server, openai_provider(), context, reply)
    assert [c.id for c in result.tool_calls] == ["call_0", "call_1_1"]


def test_repeated_id_and_name_on_every_fragment(server, openai_provider, context) -> None:
    """Some servers repeat id, type and name with each fragment; they are not concatenated."""
    reply = Reply.sse(
        [
            chunk({"tool_calls": [call(0, id="c1", name="lookup", args='{"q": ')]}),
            chunk({"tool_calls": [call(0, id="c1", name="lookup", args='"tea"')]}),
            chunk({"tool_calls": [call(0, id="c1", name="lookup", args="}")]}),
            chunk({}, "tool_calls"),
        ]
    )
    result, recorded = infer(server, openai_provider(), context, reply)
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("c1", "lookup", '{"q": "tea"}')
    ]
    assert recorded.calls() == [{"id": "c1", "name": "lookup", "arguments": '{"q": "tea"}'}]


def test_ollama_calls_without_index(server, openai_provider, context) -> None:
    """Ollama sends whole calls with no ``index``: one chunk with two, then one more alone."""
    reply = Reply.sse(
        [
            chunk(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        call(id="call_a", name="first", args='{"n":1}'),
                        call(id="call_b", name="second", args='{"n":2}'),
                    ],
                }
            ),
            chunk(
                {"role": "assistant", "tool_calls": [call(id="call_c", name="third", args="{}")]}
            ),
            chunk({"role": "assistant", "content": ""}, "stop"),
        ]
    )
    result, recorded = infer(server, openai_provider(), context, reply)
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_a", "first", '{"n":1}'),
        ("call_b", "second", '{"n":2}'),
        ("call_c", "third", "{}"),
    ]
    assert result.finish_reason == "tool_calls"
    assert [d.index for d in recorded.deltas if d.name] == [0, 1, 2]


def test_fragments_without_index_continue_the_last_call(server, openai_provider, context) -> None:
    reply = Reply.sse(
        [
            chunk({"tool_calls": [call(name="f", args='{"a"')]}),
            chunk({"tool_calls": [call(args=": 5}")]}),
            chunk({}, "tool_calls"),
        ]
    )
    result, _ = infer(server, openai_provider(), context, reply)
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_1_0", "f", '{"a": 5}')
    ]


def test_arguments_sent_as_an_object(server, openai_provider, context) -> None:
    reply = Reply.sse(
        [
            chunk({"tool_calls": [call(0, id="c", name="f", args={"city": "Oslo"})]}),
            chunk({}, "tool_calls"),
        ]
    )
    result, _ = infer(server, openai_provider(), context, reply)
    assert json.loads(result.tool_calls[0].arguments) == {"city": "Oslo"}


def test_text_and_tool_call_in_one_chunk(server, openai_provider, context) -> None:
    reply = Reply.sse(
        [
            chunk({"content": "Checking. ", "tool_calls": [call(0, id="c", name="f", args="{}")]}),
            chunk({}, "tool_calls"),
        ]
    )
    result, recorded = infer(server, openai_provider(), context, reply)
    assert result.text == "Checking. "
    assert [(c.id, c.name) for c in result.tool_calls] == [("c", "f")]
    assert [d.kind for d in recorded.deltas] == ["text", "tool_call", "tool_call"]


def test_only_the_first_choice_is_the_answer(server, openai_provider, context) -> None:
    reply = Reply.sse(
        [
            chunk({"content": "first"}, index=0),
            chunk({"content": "second"}, index=1),
            chunk({}, "stop", index=0),
            chunk({}, "stop", index=1),
        ]
    )
    result, _ = infer(server, openai_provider(), context, reply)
    assert result.text == "first"


def test_vllm_stop_reason_and_groq_extras_are_ignored(server, openai_provider, context) -> None:
    last = chunk({"content": "!"}, "length")
    last["choices"][0]["stop_reason"] = None
    reply = Reply.sse(
        [
            chunk({"reasoning": "thinking...", "channel": "analysis"}),
            {**chunk({"content": "Hi"}), "x_groq": {"id": "req_1"}},
            last,
        ]
    )
    result, recorded = infer(server, openai_provider(), context, reply)
    assert (result.text, result.finish_reason) == ("Hi!", "length")
    assert recorded.text == "Hi!"


# --- how a stream ends -----------------------------------------------------------------


def test_missing_finish_reason_with_done_is_inferred(server, openai_provider, context) -> None:
    result, _ = infer(
        server, openai_provider(), context, Reply.sse([chunk({"content": "done"})], done=True)
    )
    assert (result.text, result.finish_reason) == ("done", "stop")


def test_missing_finish_reason_with_done_and_calls(server, openai_provider, context) -> None:
    reply = Reply.sse([chunk({"tool_calls": [call(0, id="c", name="f", args="{}")]})], done=True)
    result, _ = infer(server, openai_provider(), context, reply)
    assert result.finish_reason == "tool_calls"


def test_finish_reason_without_done_is_complete(server, openai_provider, context) -> None:
    reply = Reply.sse([chunk({"content": "ok"}), chunk({}, "stop")], done=False, framing="close")
    result, _ = infer(server, openai_provider(), context, reply)
    assert (result.text, result.finish_reason) == ("ok", "stop")


def test_clean_end_without_finish_or_done_is_incomplete(server, openai_provider, context) -> None:
    """The body ends at an event boundary with no marker: a cut, not a short answer."""
    reply = Reply.sse([chunk({"content": "partial"})], done=False, framing="close")
    with pytest.raises(ModelError) as caught:
        infer(server, openai_provider(), context, reply)
    assert caught.value.retryable is True
    assert "incomplete stream" in caught.value.message


def test_empty_stream_is_incomplete(server, openai_provider, context) -> None:
    reply = Reply(headers={"content-type": "text/event-stream"}, body=b": keep-alive\n\n")
    with pytest.raises(ModelError) as caught:
        infer(server, openai_provider(), context, reply)
    assert caught.value.retryable is True


def test_cut_inside_tool_arguments_is_retryable(server, openai_provider, context) -> None:
    events = [
        chunk({"tool_calls": [call(0, id="c", name="f", args='{"a": ')]}),
        chunk({"tool_calls": [call(0, args="12}")]}),
        chunk({}, "tool_calls"),
    ]
    full = Reply.sse(events)
    cut_at = full.body.index(b"12}")
    reply = Reply.sse(events, framing="chunked", split=True, cut_after=cut_at)
    with pytest.raises(ModelError) as caught:
        infer(server, openai_provider(), context, reply)
    assert caught.value.retryable is True
    assert "cut mid-way" in caught.value.message


@pytest.mark.parametrize(
    ("wire", "calls", "expected"),
    [
        ("stop", False, "stop"),
        ("eos", False, "stop"),
        ("length", False, "length"),
        ("length", True, "length"),
        ("content_filter", False, "content_filter"),
        ("tool_calls", True, "tool_calls"),
        ("function_call", True, "tool_calls"),
        ("stop", True, "tool_calls"),
        ("tool_calls", False, "stop"),
        ("something_new", False, "something_new"),
    ],
)
def test_finish_reasons(server, openai_provider, context, wire, calls, expected) -> None:
    delta = {"tool_calls": [call(0, id="c", name="f", args="{}")]} if calls else {"content": "x"}
    result, _ = infer(
        server, openai_provider(), context, Reply.sse([chunk(delta), chunk({}, wire)])
    )
    assert result.finish_reason == expected


# --- non-streamed answers and malformed ones -----------------------------------------------


def test_server_that_ignores_stream_true(server, openai_provider, context) -> None:
    completion = {
        "id": "x",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "whole"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1},
    }
    result, recorded = infer(server, openai_provider(), context, Reply.json(200, completion))
    assert (result.text, result.finish_reason) == ("whole", "stop")
    assert dict(result.usage) == {"input_tokens": 2, "output_tokens": 1}
    assert recorded.text == "whole"
    assert server.seen[0].body["stream"] is True


def test_error_object_inside_a_200(server, openai_provider, context) -> None:
    body = {"error": {"message": "upstream overloaded", "type": "server_error"}}
    with pytest.raises(ModelError) as caught:
        infer(server, openai_provider(), context, Reply.json(200, body))
    assert caught.value.retryable is True
    assert "upstream overloaded" in caught.value.message


def test_error_data_without_event_name_mid_stream(server, openai_provider, context) -> None:
    reply = Reply.sse(
        [
            chunk({"content": "a"}),
            {"error": {"message": "The server had an error", "type": "server_error"}},
        ],
        done=False,
    )
    with pytest.raises(ModelError) as caught:
        infer(server, openai_provider(), context, reply)
    assert caught.value.retryable is True
    assert "The server had an error" in caught.value.message


def test_mid_stream_authentication_error_is_fatal(server, openai_provider, context) -> None:
    body = (
        b'event: error\ndata: {"error": {"message": "key revoked", "type": "invalid_api_key"}}\n\n'
    )
    reply = Reply(headers={"content-type": "text/event-stream"}, body=body)
    with pytest.raises(ModelError) as caught:
        infer(server, openai_provider(), context, reply)
    assert caught.value.retryable is False
    assert "key revoked" in caught.value.message


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (Reply.sse(["{not json"]), "not JSON"),
        (Reply.sse(["[1, 2]"]), "not an object"),
        (Reply(headers={"content-type": "text/html"}, body=b"<html>login</html>"), "not JSON"),
        (Reply.json(200, {"id": "x", "choices": []}), "no choices"),
        (Reply.sse(['{"choices": "nope"}']), "choices is not a list"),
        (Reply.sse(['{"choices": [{"index": 0, "delta": "text"}]}']), "delta is not an object"),
        (
            Reply.sse(['{"choices": [{"index": 0, "delta": {"tool_calls": ["x"]}}]}']),
            "tool_calls is not a list of objects",
        ),
    ],
)
def test_malformed_responses_are_fatal(server, openai_provider, context, reply, why) -> None:
    with pytest.raises(ModelError) as caught:
        infer(server, openai_provider(), context, reply)
    assert caught.value.retryable is False
    assert "malformed response" in caught.value.message
    assert why in caught.value.message


# --- the request ---------------------------------------------------------------------


CONVERSATION = InferenceRequest(
    model="gpt-test",
    instructions="Be brief.",
    messages=(
        Message(role="user", content="Weather in Oslo and Rome?"),
        Message(
            role="assistant",
            content="Looking.",
            tool_calls=(
                {"id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
                {"id": "c2", "name": "weather", "arguments": ""},
            ),
        ),
        Message(role="tool", content="rain", tool_call_id="c1", name="weather"),
        Message(role="tool", content="sun", tool_call_id="c2", name="weather"),
        Message(role="assistant", content="Oslo rain, Rome sun."),
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
    options={"temperature": 0, "max_tokens": 50},
)


def test_request_body_maps_every_role() -> None:
    assert request_body(CONVERSATION, {"temperature": 1, "seed": 7}) == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo and Rome?"},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
            {"role": "tool", "tool_call_id": "c2", "content": "sun"},
            {"role": "assistant", "content": "Oslo rain, Rome sun."},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Weather now.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            },
            {
                "type": "function",
                "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}},
            },
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 50,
        "seed": 7,
        "temperature": 0,  # the request's options win over the config's
    }


def test_request_body_is_deterministic() -> None:
    first = json.dumps(request_body(CONVERSATION, {"b": 1, "a": 2}))
    again = json.dumps(request_body(CONVERSATION, {"a": 2, "b": 1}))
    assert first == again


def test_request_options_cannot_replace_model_or_messages() -> None:
    request = InferenceRequest(
        model="m", instructions="", messages=(), options={"model": "x", "messages": []}
    )
    assert request_body(request) == {
        "model": "m",
        "messages": [],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_non_streaming_and_no_stream_options() -> None:
    off = InferenceRequest(model="m", instructions="", messages=(), options={"stream": False})
    assert request_body(off) == {"model": "m", "messages": [], "stream": False}
    bare = InferenceRequest(
        model="m", instructions="", messages=(), options={"stream_options": None}
    )
    assert request_body(bare) == {"model": "m", "messages": [], "stream": True}


def test_the_sdk_sends_the_mapped_body(server, openai_provider, context) -> None:
    infer(
        server,
        openai_provider(),
        context,
        Reply.sse([chunk({"content": "ok"}, "stop")]),
        CONVERSATION,
    )
    assert server.seen[0].body == request_body(CONVERSATION)


def test_config_model_fills_an_empty_request_model(server, openai_provider, context) -> None:
    request = InferenceRequest(model="", instructions="", messages=ASK.messages)
    infer(
        server,
        openai_provider(model="from-config"),
        context,
        Reply.sse([chunk({}, "stop")]),
        request,
    )
    assert server.seen[0].body["model"] == "from-config"


def test_api_key_from_the_named_variable(server, openai_provider, context, monkeypatch) -> None:
    monkeypatch.setenv("H6_TEST_KEY", "sk-from-env")
    infer(
        server, openai_provider(api_key_env="H6_TEST_KEY"), context, Reply.sse([chunk({}, "stop")])
    )
    assert server.seen[0].headers["authorization"] == "Bearer sk-from-env"


def test_missing_key_for_a_local_server(server, openai_provider, context, monkeypatch) -> None:
    monkeypatch.delenv("H6_MISSING_KEY", raising=False)
    infer(
        server,
        openai_provider(api_key_env="H6_MISSING_KEY"),
        context,
        Reply.sse([chunk({}, "stop")]),
    )
    assert server.seen[0].headers["authorization"] == "Bearer not-needed"


def test_the_sdk_does_not_retry(server, openai_provider, context) -> None:
    with pytest.raises(ModelError):
        infer(server, openai_provider(), context, Reply.json(503, {"error": {"message": "busy"}}))
    assert len(server.seen) == 1
