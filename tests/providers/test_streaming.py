"""Live Deltas, best-effort stream checkpoints and what a retry does with ``resume_from``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.domain.model import Message
from runtime.providers.base import InferenceRequest, ModelError
from runtime.providers.streaming import CHECKPOINT_EVERY
from tests.providers.replay import Reply, infer, load_fixture

ASK = InferenceRequest(model="m", instructions="", messages=(Message(role="user", content="hi"),))


def text_stream(words: list[str]) -> Reply:
    events: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]} for w in words
    ]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return Reply.sse(events, framing="chunked", split=True)


def test_checkpoints_every_few_deltas(server, openai_provider, context) -> None:
    words = [f"w{i} " for i in range(20)]
    server.queue(text_stream(words))
    ctx, recorded = context()
    result = infer(openai_provider(), ASK, ctx)
    assert result.text == "".join(words)
    every = CHECKPOINT_EVERY
    assert [text for text, _ in recorded.checkpoints] == [
        "".join(words[:every]),
        "".join(words[: 2 * every]),
    ]


def test_checkpoint_holds_only_complete_calls(server, openai_provider, context) -> None:
    """Parallel calls: call 0 is whole once call 1 opens; call 1 completes at the finish."""
    server.queue(Reply.from_fixture(load_fixture("openai-stream-parallel-tools.json")))
    ctx, recorded = context()
    infer(openai_provider(), ASK, ctx)
    complete_sets = [calls for _, calls in recorded.checkpoints]
    assert complete_sets[0] == [
        {"id": "call_8Sp49rZGndlZALo0uq1XvA7A", "name": "plus", "arguments": '{"a": 2, "b": 3}'}
    ]
    assert complete_sets[-1] == [
        {"id": "call_8Sp49rZGndlZALo0uq1XvA7A", "name": "plus", "arguments": '{"a": 2, "b": 3}'},
        {"id": "call_u5dbdPz1mAis8zZVk4ZBqXgL", "name": "minus", "arguments": '{"a": 3, "b": 2}'},
    ]
    for calls in complete_sets:  # never a half-written call
        for call in calls:
            json.loads(call["arguments"])


def test_anthropic_checkpoints_a_call_at_its_block_stop(
    server, anthropic_provider, context
) -> None:
    fixture = load_fixture("anthropic-stream-text-and-parallel-tool-use.json")
    server.queue(Reply.from_fixture(fixture))
    ctx, recorded = context()
    infer(anthropic_provider(), ASK, ctx)
    with_weather = [c for c in recorded.checkpoints if len(c[1]) == 1]
    assert with_weather, "no checkpoint after the first tool_use block stopped"
    text, calls = with_weather[0]
    assert text.endswith("Let me fetch that data for you.")
    assert calls == [
        {
            "id": "toolu_014x5X91kx3fvdhpLvwXZWE2",
            "name": "get_weather",
            "arguments": '{"location": "San Francisco, CA", "unit": "celsius"}',
        }
    ]


def test_checkpoint_before_a_cut_keeps_the_completed_call(
    server, anthropic_provider, context
) -> None:
    """The stream dies inside the second call: the checkpoint has the first, whole."""
    fixture = load_fixture("anthropic-stream-text-and-parallel-tool-use.json")
    body = fixture["response"]["body"].encode()
    cut = body.index(b'"partial_json":"one')
    server.queue(Reply.from_fixture(fixture, framing="chunked", split=True, cut_after=cut))
    ctx, recorded = context()
    with pytest.raises(ModelError) as caught:
        infer(anthropic_provider(), ASK, ctx)
    assert caught.value.retryable is True
    assert [c["name"] for c in recorded.checkpoints[-1][1]] == ["get_weather"]


def test_a_failing_checkpoint_never_fails_the_inference(server, openai_provider, context) -> None:
    def broken(text, calls):
        raise OSError("database is locked")

    server.queue(text_stream([f"{i} " for i in range(30)]))
    ctx, recorded = context(checkpoint=broken)
    result = infer(openai_provider(), ASK, ctx)
    assert result.text == "".join(f"{i} " for i in range(30))
    assert recorded.text == result.text


def test_a_failing_delta_sink_never_fails_the_inference(
    server, anthropic_provider, context
) -> None:
    def broken(delta):
        raise RuntimeError("channel layer down")

    server.queue(Reply.from_fixture(load_fixture("anthropic-stream-tool-use.json")))
    ctx, _ = context(on_delta=broken)
    result = infer(anthropic_provider(), ASK, ctx)
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("plus", '{"a": 1, "b": 2}')]


RESUME = {
    "text": "An earlier attempt said this",
    "tool_calls": [{"id": "call_old", "name": "plus", "arguments": '{"a": 9}'}],
}


@pytest.mark.parametrize(
    ("kind", "fixture"),
    [
        ("openai", "openai-stream-parallel-tools.json"),
        ("openai", "openai-stream-text.json"),
        ("anthropic", "anthropic-stream-text-and-parallel-tool-use.json"),
    ],
)
def test_resume_from_restarts_the_request(
    kind, fixture, server, openai_provider, anthropic_provider, context
) -> None:
    """A retry with a checkpoint sends the identical request and returns only the new stream.

    Nothing of the interrupted attempt is glued on, and the new attempt publishes its Deltas
    from the start (the loop tags them with the new attempt number).
    """
    recorded_fixture = load_fixture(fixture)
    make = openai_provider if kind == "openai" else anthropic_provider
    server.queue(Reply.from_fixture(recorded_fixture))
    fresh_ctx, _ = context(attempt=1)
    fresh = infer(make(), ASK, fresh_ctx)

    server.queue(Reply.from_fixture(recorded_fixture))
    retry_ctx, recorded = context(attempt=2, resume_from=RESUME)
    retried = infer(make(), ASK, retry_ctx)

    assert retried == fresh
    assert "earlier attempt" not in retried.text
    assert "call_old" not in [c.id for c in retried.tool_calls]
    assert recorded.text == retried.text
    assert [(c["id"], c["name"], c["arguments"]) for c in recorded.calls()] == [
        (c.id, c.name, c.arguments) for c in retried.tool_calls
    ]
    first, second = server.seen[-2:]
    assert first.body == second.body


def test_delta_protocol_matches_the_scripted_provider(server, openai_provider, context) -> None:
    """A call opens with a header Delta (name, call_id, no text), then argument fragments."""
    server.queue(Reply.from_fixture(load_fixture("openai-stream-single-tool.json")))
    ctx, recorded = context()
    infer(openai_provider(), ASK, ctx)
    header, *fragments = recorded.deltas
    assert (header.kind, header.index, header.name, header.call_id, header.text) == (
        "tool_call",
        0,
        "multiply",
        "call_1EYWDzueHEp8OsB8jJSEp7WB",
        "",
    )
    assert all(d.kind == "tool_call" and d.name is None and d.index == 0 for d in fragments)
    assert "".join(d.text for d in fragments) == '{"a":1231,"b":2331}'
    assert len(fragments) == 11  # one per recorded fragment (README: "11 fragments")
