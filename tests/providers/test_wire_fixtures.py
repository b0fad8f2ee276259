"""Every recorded exchange in the shared wire fixtures, replayed through the real SDK clients.

For each fixture the test builds the ``InferenceRequest`` that means the same as the recorded
request, checks that the provider sends the recorded body (JSON-equal, with the few
differences of shape named in the table), replays the recorded response over loopback HTTP,
whole and split into flushed SSE events, and checks the exact result or error. A fixture with
no entry in the table fails ``test_every_fixture_is_replayed``: nothing is skipped silently.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from runtime.domain.model import Message
from runtime.providers.base import InferenceRequest, ModelError, ToolSpec
from tests.providers.replay import Reply, fixture_names, infer, load_fixture, wire_dir


@dataclass(frozen=True)
class Ok:
    text: str
    calls: list[tuple[str, str, str]]  # (id, name, raw arguments)
    finish: str
    usage: dict[str, int]


@dataclass(frozen=True)
class Fails:
    retryable: bool
    status: int | None
    says: list[str]
    retry_after: float | None = None


@dataclass(frozen=True)
class Case:
    kind: str  # "openai" | "anthropic"
    model: str
    messages: list[Message]
    expect: Ok | Fails
    instructions: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    # Recorded-body differences that are a choice of equivalent shape, not a mismatch:
    # "empty_description": the recorder sent description "", we leave the key out;
    # "text_blocks": the recorder sent user text as [{"type": "text"}] blocks, we send a string;
    # "stream_false": the recorder left ``stream`` out (false by default), we send false.
    same_shape_except: tuple[str, ...] = ()


def user(text: str) -> Message:
    return Message(role="user", content=text)


CASES: dict[str, Case] = {
    "openai-stream-single-tool.json": Case(
        kind="openai",
        model="gpt-4o-mini",
        messages=[user("What is 1231 * 2331?")],
        expect=Ok(
            text="",
            calls=[("call_1EYWDzueHEp8OsB8jJSEp7WB", "multiply", '{"a":1231,"b":2331}')],
            finish="tool_calls",
            usage={"input_tokens": 54, "output_tokens": 20},
        ),
    ),
    "openai-stream-text.json": Case(
        kind="openai",
        model="gpt-4o-mini",
        messages=[
            user("What is 1231 * 2331?"),
            Message(role="assistant", content=""),
            Message(
                role="assistant",
                tool_calls=(
                    {
                        "id": "call_1EYWDzueHEp8OsB8jJSEp7WB",
                        "name": "multiply",
                        "arguments": '{"a": 1231, "b": 2331}',
                    },
                ),
            ),
            Message(
                role="tool",
                content="2869461",
                tool_call_id="call_1EYWDzueHEp8OsB8jJSEp7WB",
                name="multiply",
            ),
        ],
        expect=Ok(
            text=r"The result of \( 1231 \times 2331 \) is \( 2,869,461 \).",
            calls=[],
            finish="stop",
            usage={"input_tokens": 87, "output_tokens": 26},
        ),
    ),
    "openai-stream-parallel-tools.json": Case(
        kind="openai",
        model="gpt-4o",
        messages=[user("Sum 2 and 3. Also subtract 2 from 3.")],
        options={"tool_choice": "required"},
        expect=Ok(
            text="",
            calls=[
                ("call_8Sp49rZGndlZALo0uq1XvA7A", "plus", '{"a": 2, "b": 3}'),
                ("call_u5dbdPz1mAis8zZVk4ZBqXgL", "minus", '{"a": 3, "b": 2}'),
            ],
            finish="tool_calls",
            usage={"input_tokens": 82, "output_tokens": 50},
        ),
    ),
    "openai-nonstream-tool-call.json": Case(
        kind="openai",
        model="gpt-4o-mini",
        messages=[user("Can the country of Crumpet have dragons? Answer with only YES or NO")],
        options={"stream": False},
        expect=Ok(
            text="",
            calls=[("call_TTY8UFNo7rNCaOBUNtlRSvMG", "lookup_population", '{"country":"Crumpet"}')],
            finish="tool_calls",
            usage={"input_tokens": 92, "output_tokens": 17},
        ),
    ),
    "openai-error-400-unsupported-parameter.json": Case(
        kind="openai",
        model="gpt-5-mini",
        messages=[user("What is 4200 + 42?")],
        options={"stream": False, "max_completion_tokens": 500, "seed": 42, "stop": ["4242"]},
        same_shape_except=("stream_false",),
        expect=Fails(
            retryable=False,
            status=400,
            says=[
                "Unsupported parameter: 'stop' is not supported with this model.",
                "unsupported_parameter",
                "req_3855783c722245b6ab7e4e7f7b2d85ce",
            ],
        ),
    ),
    "openai-error-404-model-not-found-on-stream.json": Case(
        kind="openai",
        model="this-model-does-not-exist-12345",
        messages=[user("This should fail with NotFoundError")],
        expect=Fails(
            retryable=False,
            status=404,
            says=[
                "The model `this-model-does-not-exist-12345` does not exist",
                "model_not_found",
            ],
        ),
    ),
    "openrouter-error-429-rate-limited.json": Case(
        kind="openai",
        model="google/gemini-2.0-flash-exp:free",
        instructions="Be helpful.",
        messages=[user("Tell me a joke.")],
        options={"stream": False},
        expect=Fails(
            retryable=True,
            status=429,
            says=["Provider returned error", "is temporarily rate-limited upstream"],
            retry_after=None,  # no retry-after header was recorded
        ),
    ),
    "groq-stream-error-event-midstream.json": Case(
        kind="openai",
        model="openai/gpt-oss-120b",
        instructions="Be concise. Never use pretty double quotes, just regular ones.",
        messages=[
            user(
                'Please call the "get_something_by_name" tool with non-existent parameters to '
                "test error handling; on the second try you can use valid args"
            )
        ],
        options={"n": 1, "tool_choice": "auto", "stream_options": None},
        same_shape_except=("empty_description",),
        expect=Fails(
            retryable=True,  # the request was accepted; the generated call was bad
            status=None,
            says=["tool_use_failed", "Tool call validation failed", "mid-stream"],
        ),
    ),
    "ollama-openai-stream-text.json": Case(
        kind="openai",
        model="llama3.1",
        messages=[user("Say hello!")],
        expect=Ok(
            text="Hello! How are you today? Is there something I can help you with or would "
            "you like to chat?",
            calls=[],
            finish="stop",
            usage={},  # Ollama sent no usage chunk although it was asked for
        ),
    ),
    "ollama-openai-stream-tool-call.json": Case(
        kind="openai",
        model="llama3.1",
        messages=[user("Return True.")],
        options={
            "parallel_tool_calls": False,
            "tool_choice": {"type": "function", "function": {"name": "return_bool"}},
        },
        expect=Ok(
            text="",
            calls=[("call_kve3oltz", "return_bool", '{"value":true}')],
            finish="tool_calls",  # Ollama said "stop"
            usage={},
        ),
    ),
    "vllm-openai-stream-text.json": Case(
        kind="openai",
        model="facebook/opt-125m",
        instructions="You are a helpful assistant ",
        messages=[user("Tell me a joke about OpenTelemetry")],
        options={"max_tokens": 20, "n": 1, "temperature": 0.7, "stream_options": None},
        expect=Ok(
            text="<|im_end|>doctor\n<|im_end|>supervisor\n<",
            calls=[],
            finish="length",
            usage={},
        ),
    ),
    "anthropic-stream-text.json": Case(
        kind="anthropic",
        model="claude-opus-4-6",
        messages=[user("Two names for a pet pelican, be brief")],
        options={"max_tokens": 8192, "temperature": 1.0},
        same_shape_except=("text_blocks",),
        expect=Ok(
            text="1. **Captain Scoop**\n2. **Gullet**",
            calls=[],
            finish="stop",
            usage={"input_tokens": 17, "output_tokens": 20},
        ),
    ),
    "anthropic-stream-tool-use.json": Case(
        kind="anthropic",
        model="claude-3-haiku-20240307",
        messages=[user("Use the tool to sum 1 and 2")],
        options={"max_tokens": 1024, "tool_choice": {"type": "tool", "name": "plus"}},
        same_shape_except=("text_blocks",),
        expect=Ok(
            text="",
            calls=[("toolu_01241nJU2Az1M4ksrkC48L7F", "plus", '{"a": 1, "b": 2}')],
            finish="tool_calls",
            usage={"input_tokens": 450, "output_tokens": 50},
        ),
    ),
    "anthropic-stream-text-and-parallel-tool-use.json": Case(
        kind="anthropic",
        model="claude-3-5-sonnet-20240620",
        messages=[user("What is the weather and current time in San Francisco?")],
        options={"max_tokens": 1024},
        expect=Ok(
            text="Certainly! I can help you with that information. To get the weather and "
            "current time in San Francisco, I'll need to use two separate functions. Let me "
            "fetch that data for you.",
            calls=[
                (
                    "toolu_014x5X91kx3fvdhpLvwXZWE2",
                    "get_weather",
                    '{"location": "San Francisco, CA", "unit": "celsius"}',
                ),
                (
                    "toolu_0121kXsENLvoDZ72LCuAnCCz",
                    "get_time",
                    '{"timezone": "America/Los_Angeles"}',
                ),
            ],
            finish="tool_calls",
            usage={"input_tokens": 506, "output_tokens": 153},
        ),
    ),
    "anthropic-error-404-not-found-on-stream.json": Case(
        kind="anthropic",
        model="this-model-does-not-exist-12345",
        messages=[user("This should fail with NotFoundError")],
        options={"max_tokens": 16000},
        expect=Fails(
            retryable=False,
            status=404,
            says=[
                "not_found_error",
                "model: this-model-does-not-exist-12345",
                "req_011CWbziqGSV3t3Ax2Wza1WH",
            ],
        ),
    ),
}

MODES: dict[str, dict[str, Any]] = {
    "whole": {"framing": "length"},
    "events": {"framing": "chunked", "split": True},
}


def tool_specs(fixture: dict[str, Any], kind: str) -> tuple[ToolSpec, ...]:
    """The tools of the recorded request as ToolSpecs (the mapping back is under test)."""
    specs = []
    for tool in fixture["request"]["body"].get("tools", []):
        if kind == "openai":
            fn = tool["function"]
            specs.append(
                ToolSpec(
                    name=fn["name"],
                    description=fn.get("description", ""),
                    parameters=fn["parameters"],
                )
            )
        else:
            specs.append(
                ToolSpec(
                    name=tool["name"],
                    description=tool.get("description", ""),
                    parameters=tool["input_schema"],
                )
            )
    return tuple(specs)


def expected_body(fixture: dict[str, Any], case: Case) -> dict[str, Any]:
    body = copy.deepcopy(fixture["request"]["body"])
    if "empty_description" in case.same_shape_except:
        for tool in body.get("tools", []):
            if tool["function"].get("description") == "":
                del tool["function"]["description"]
    if "stream_false" in case.same_shape_except:
        body.setdefault("stream", False)
    if "text_blocks" in case.same_shape_except:
        for message in body["messages"]:
            content = message["content"]
            if isinstance(content, list) and all(b["type"] == "text" for b in content):
                message["content"] = "".join(b["text"] for b in content)
    return body


def test_every_fixture_is_replayed() -> None:
    names = fixture_names()
    assert wire_dir().is_dir(), f"wire fixtures not found at {wire_dir()}"
    assert len(names) >= 15
    assert set(names) == set(CASES), "a fixture without a case here would go untested"


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(CASES))
def test_replay(name, mode, server, openai_provider, anthropic_provider, context) -> None:
    fixture, case = load_fixture(name), CASES[name]
    server.queue(Reply.from_fixture(fixture, **MODES[mode]))
    provider = (openai_provider if case.kind == "openai" else anthropic_provider)(model="unused")
    request = InferenceRequest(
        model=case.model,
        instructions=case.instructions,
        messages=tuple(case.messages),
        tools=tool_specs(fixture, case.kind),
        options=case.options,
    )
    ctx, recorded = context()

    if isinstance(case.expect, Fails):
        with pytest.raises(ModelError) as caught:
            infer(provider, request, ctx)
        error = caught.value
        assert (error.retryable, error.status) == (case.expect.retryable, case.expect.status)
        assert error.retry_after == case.expect.retry_after
        assert error.provider == case.kind
        for words in case.expect.says:
            assert words in error.message
    else:
        result = infer(provider, request, ctx)
        assert result.text == case.expect.text
        assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == case.expect.calls
        for call in result.tool_calls:
            assert isinstance(json.loads(call.arguments), dict)
        assert result.finish_reason == case.expect.finish
        assert dict(result.usage) == case.expect.usage
        # The live Deltas alone rebuild the same answer.
        assert recorded.text == case.expect.text
        assert [(c["id"], c["name"], c["arguments"]) for c in recorded.calls()] == case.expect.calls

    (seen,) = server.seen
    expected_path = "/v1/chat/completions" if case.kind == "openai" else "/v1/messages"
    assert seen.path == expected_path
    assert seen.body == expected_body(fixture, case)
    # The official async clients: AsyncOpenAI's says OpenAI/Python, AsyncAnthropic's its name.
    agent = "OpenAI/Python" if case.kind == "openai" else "AsyncAnthropic/Python"
    assert seen.headers["user-agent"].startswith(agent)


def test_groq_reasoning_is_not_published_as_text(server, openai_provider, context) -> None:
    """Groq's ``delta.reasoning`` fragments before the error event are not answer text."""
    server.queue(Reply.from_fixture(load_fixture("groq-stream-error-event-midstream.json")))
    ctx, recorded = context()
    request = InferenceRequest(model="openai/gpt-oss-120b", instructions="", messages=(user("x"),))
    with pytest.raises(ModelError):
        infer(openai_provider(), request, ctx)
    assert recorded.deltas == []


def test_429_with_retry_after_header_sets_retry_after(server, openai_provider, context) -> None:
    fixture = load_fixture("openrouter-error-429-rate-limited.json")
    server.queue(
        Reply.from_fixture(fixture, headers={**fixture["response"]["headers"], "retry-after": "7"})
    )
    ctx, _ = context()
    request = InferenceRequest(model="m", instructions="", messages=(user("x"),))
    with pytest.raises(ModelError) as caught:
        infer(openai_provider(), request, ctx)
    assert (caught.value.retryable, caught.value.status, caught.value.retry_after) == (
        True,
        429,
        7.0,
    )


STREAMS = sorted(
    name
    for name in CASES
    if isinstance(CASES[name].expect, Ok) and name != "openai-nonstream-tool-call.json"
)


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
@pytest.mark.parametrize("name", STREAMS)
def test_stream_cut_half_way_is_retryable(
    name, framing, server, openai_provider, anthropic_provider, context
) -> None:
    """The connection drops half-way through a recorded stream: retry, never a short answer.

    ``length`` and ``chunked`` framings are never finished, so the transport notices; with
    ``close`` the body just ends cleanly and only the missing finish marker tells.
    """
    fixture, case = load_fixture(name), CASES[name]
    half = len(fixture["response"]["body"].encode()) // 2
    server.queue(Reply.from_fixture(fixture, framing=framing, split=True, cut_after=half))
    provider = (openai_provider if case.kind == "openai" else anthropic_provider)()
    ctx, _ = context()
    request = InferenceRequest(model=case.model, instructions="", messages=(user("x"),))
    with pytest.raises(ModelError) as caught:
        infer(provider, request, ctx)
    assert caught.value.retryable is True
    assert caught.value.status is None
    expected = "incomplete stream" if framing == "close" else "stream was cut mid-way"
    assert expected in caught.value.message
