"""An Anthropic Messages provider on the official ``anthropic`` SDK, always streaming.

Guarantee: the same ``InferenceRequest`` and config give the same request body (see
``request_body``); the result is exactly what the streamed message contained, or a
``ModelError`` classified by ``runtime.providers.errors``. The SDK never retries
(``max_retries=0``): the loop owns retries and backoff.

Request: the instructions (then any committed ``system`` messages, joined by a blank line)
become ``system``; user text stays a string; an assistant message becomes its text and one
``tool_use`` block per committed call, whose ``input`` is parsed from the committed raw
argument text (empty text is ``{}``; text that is not a JSON object is kept as
``{"_unparsed_arguments": text}`` so the model sees what it wrote); consecutive tool results
become one user message of ``tool_result`` blocks. An assistant message with neither text
nor calls is left out (the API refuses empty content). A ``ToolSpec`` becomes ``{"name",
"description", "input_schema"}``. Options are extra body fields; ``max_tokens`` defaults to
``DEFAULT_MAX_TOKENS`` because the API requires it; ``stream`` is always true.

Response: raw stream events (``message_start``, ``content_block_start`` text or ``tool_use``,
``text_delta``, ``input_json_delta``, ``content_block_stop``, ``message_delta``,
``message_stop``; ``ping``, thinking and unknown blocks are skipped). Tool calls are numbered
in order of appearance (Delta ``index`` 0, 1, ...), whatever their content-block index; a call
completes at its ``content_block_stop``. A ``tool_use`` whose input arrives whole in
``content_block_start`` (no ``input_json_delta``) keeps that input. The stream is complete at
``message_stop`` (or once a ``stop_reason`` arrived); anything shorter is a retryable
incomplete stream. An ``event: error`` mid-stream (overloaded, api_error) is retryable.

Stop reasons: end_turn and stop_sequence -> "stop", tool_use -> "tool_calls", max_tokens and
model_context_window_exceeded -> "length", refusal -> "content_filter"; others pass through.

SDK quirks met here: a connection cut or stalled mid-stream reaches us as the SDK's
``APIConnectionError`` / ``APITimeoutError`` in current releases and as the raw ``httpx``
transport error in older ones (both are mapped to "the stream was cut mid-way" / "stalled
past the timeout"); an ``event: error`` arrives as an ``APIStatusError`` whose
``status_code`` is the stream's 200.

Stream checkpoints and ``resume_from``: see ``runtime.providers.streaming`` (restart).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anthropic

from runtime.providers import errors, keys
from runtime.providers.base import (
    InferenceContext,
    InferenceRequest,
    InferenceResult,
    ModelError,
)
from runtime.providers.streaming import PartialCall, StreamSink

if TYPE_CHECKING:
    from runtime.agents import ProviderConfig

NAME = "anthropic"
DEFAULT_MAX_TOKENS = 4096

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


def tool_input(arguments: str | None) -> dict[str, Any]:
    """The ``input`` object of a committed call's raw argument text."""
    if not arguments or not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    return {"_unparsed_arguments": arguments}


def messages_and_system(request: InferenceRequest) -> tuple[list[dict[str, Any]], str]:
    """The committed conversation as Messages API turns, and the system text."""
    system = [request.instructions] if request.instructions else []
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] | None = None  # the open user turn of tool results
    for m in request.messages:
        if m.role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id,
                "content": m.content,
            }
            if m.meta.get("is_error"):
                block["is_error"] = True
            if results is None:
                results = []
                out.append({"role": "user", "content": results})
            results.append(block)
            continue
        results = None
        if m.role == "system":
            if m.content:
                system.append(m.content)
        elif m.role == "assistant":
            if not m.tool_calls:
                if m.content:
                    out.append({"role": "assistant", "content": m.content})
                continue
            blocks: list[dict[str, Any]] = []
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            for c in m.tool_calls:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": c["id"],
                        "name": c["name"],
                        "input": tool_input(c.get("arguments")),
                    }
                )
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": "user", "content": m.content})
    return out, "\n\n".join(system)


def request_body(
    request: InferenceRequest, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON body sent for ``request``; ``defaults`` are the config's options.

    Deterministic: model, max_tokens, messages, system, tools, stream, then the remaining
    options in sorted key order.
    """
    options = {**(defaults or {}), **request.options}
    for reserved in ("model", "messages", "system", "stream"):
        options.pop(reserved, None)
    messages, system = messages_and_system(request)
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": options.pop("max_tokens", DEFAULT_MAX_TOKENS),
        "messages": messages,
    }
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [
            {
                "name": spec.name,
                **({"description": spec.description} if spec.description else {}),
                "input_schema": dict(spec.parameters),
            }
            for spec in request.tools
        ]
    body["stream"] = True
    for key in sorted(options):
        body[key] = options[key]
    return body


class _Assembly:
    """Raw Messages stream events folded into the sink."""

    def __init__(self, sink: StreamSink) -> None:
        self.sink = sink
        self.calls: dict[int, PartialCall] = {}  # by content-block index
        self.initial_input: dict[int, Any] = {}
        self.stop_reason: str | None = None
        self.done = False
        self.usage: dict[str, Any] = {}

    def feed(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self._usage(getattr(event.message, "usage", None))
        elif kind == "content_block_start":
            block = event.content_block
            if block.type == "text":
                self.sink.add_text(block.text or "")
            elif block.type == "tool_use":
                self.calls[event.index] = self.sink.open_call(block.id, block.name)
                if block.input:
                    self.initial_input[event.index] = block.input
        elif kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                self.sink.add_text(delta.text)
            elif delta.type == "input_json_delta" and event.index in self.calls:
                self.sink.add_arguments(self.calls[event.index], delta.partial_json)
        elif kind == "content_block_stop":
            call = self.calls.get(event.index)
            if call is not None:
                if not call.parts and event.index in self.initial_input:
                    self.sink.add_arguments(call, json.dumps(self.initial_input[event.index]))
                self.sink.complete_call(call)
        elif kind == "message_delta":
            self.stop_reason = getattr(event.delta, "stop_reason", None) or self.stop_reason
            self._usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.done = True

    def _usage(self, usage: Any) -> None:
        for key in ("input_tokens", "output_tokens"):
            value = getattr(usage, key, None)
            if isinstance(value, int):
                self.usage[key] = value

    def finish(self) -> str:
        if not self.done and self.stop_reason is None:
            raise errors.incomplete(NAME, "the stream ended before message_stop")
        for call in self.sink.calls:
            self.sink.complete_call(call)
        has_calls = bool(self.sink.calls)
        raw = self.stop_reason or ("tool_use" if has_calls else "end_turn")
        mapped = STOP_REASONS.get(raw, raw)
        if mapped == "stop" and has_calls:
            return "tool_calls"
        if mapped == "tool_calls" and not has_calls:
            return "stop"
        return mapped


class AnthropicProvider:
    """Claude models through the Messages API."""

    name = NAME

    def __init__(
        self, config: ProviderConfig, *, client: anthropic.AsyncAnthropic | None = None
    ) -> None:
        self.config = config
        key = keys.api_key(config.api_key_env, "ANTHROPIC_API_KEY", NAME)
        self.client = client or anthropic.AsyncAnthropic(
            base_url=keys.anthropic_base_url(config.base_url),
            api_key=key,
            timeout=config.timeout,
            max_retries=0,
        )

    @property
    def url(self) -> str:
        """The base URL requests go to (named in connection errors)."""
        return str(self.client.base_url)

    async def close(self) -> None:
        await self.client.close()

    def body(self, request: InferenceRequest) -> dict[str, Any]:
        if not request.model and self.config.model:
            request = replace(request, model=self.config.model)
        return request_body(request, self.config.options)

    async def infer(self, request: InferenceRequest, ctx: InferenceContext) -> InferenceResult:
        body = self.body(request)
        fixed = {k: body.pop(k) for k in ("model", "max_tokens", "messages", "stream")}
        sink = StreamSink(ctx, NAME)
        assembly = _Assembly(sink)
        streaming = False  # the server answered 200 and its events are being read
        try:
            async with await self.client.messages.create(**fixed, extra_body=body) as stream:
                streaming = True
                content_type = stream.response.headers.get("content-type", "")
                if "text/event-stream" not in content_type:
                    raise errors.malformed(
                        NAME, f"a stream was asked for, the server sent {content_type!r}"
                    )
                async for event in stream:
                    assembly.feed(event)
        except ModelError:
            raise
        except anthropic.APIStatusError as exc:
            if exc.status_code < 300:  # an ``event: error`` inside a 200 stream
                raise errors.midstream(NAME, exc.body) from exc
            raise errors.from_status(
                NAME,
                exc.status_code,
                exc.body,
                exc.response.headers,
                request_id=exc.response.headers.get("request-id"),
            ) from exc
        except anthropic.APIConnectionError as exc:  # includes APITimeoutError
            # Current SDKs wrap a stream cut or stalled mid-way too (older ones let the transport
            # error escape: the last clause), so whether the stream had begun is ours to know.
            raise errors.connection(NAME, exc, mid_stream=streaming, url=self.url) from exc
        except anthropic.APIResponseValidationError as exc:
            raise errors.malformed(NAME, str(exc)) from exc
        except json.JSONDecodeError as exc:
            raise errors.malformed(NAME, f"a stream event is not JSON: {exc}") from exc
        except errors.transport_errors() as exc:
            raise errors.connection(NAME, exc, mid_stream=True, url=self.url) from exc
        return sink.result(assembly.finish(), assembly.usage)
