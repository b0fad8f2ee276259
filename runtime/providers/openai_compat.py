"""An OpenAI-compatible chat-completions provider (OpenAI, vLLM, Ollama, llama.cpp, LM Studio,
gateways) on the official ``openai`` SDK.

Guarantee: the same ``InferenceRequest`` and config give the same request body (see
``request_body``); the result is exactly what the response contained, or a ``ModelError``
classified by ``runtime.providers.errors`` (retryable or fatal, with the server's message).
The SDK never retries (``max_retries=0``): retries, backoff and the run's failure belong to the
loop.

Request: instructions become the first ``system`` message; committed messages keep their
roles; assistant ``tool_calls`` ``{"id", "name", "arguments"}`` become OpenAI function calls
with the raw argument text (``{}`` when empty, which some local servers would fail to parse);
tool results carry ``tool_call_id``; a ``ToolSpec`` becomes ``{"type": "function", "function":
{"name", "description", "parameters"}}`` (no description key when it is empty). Options (the
config's, then the request's) are extra body fields: ``stream`` (default true),
``stream_options`` (default ``{"include_usage": true}``; ``null`` leaves it out, for servers
that reject it) and anything else (temperature, max_tokens, tool_choice, ...).

Response: the SDK sends the request and raises the HTTP status errors; the body is read here,
line by line, as Server-Sent Events of plain JSON chunks, because the SDK's stream hides the
``[DONE]`` marker and a clean end of stream from a stream that simply stopped. Differences
between servers that are handled (each has a test): a role-only first chunk, ``content:
null`` or ``""``, every delta repeating ``role`` (Ollama), a usage chunk with ``choices: []``,
no usage at all, a tool call that arrives whole in one chunk with no ``index`` (Ollama),
missing or repeated call ids and names, arguments sent as a JSON object instead of text,
``finish_reason`` "stop" after tool calls (Ollama), vLLM's extra ``stop_reason``, Groq's
``reasoning``/``x_groq`` fields (ignored), an ``event: error`` mid-stream, and a server that
ignores ``stream: true`` and answers with one JSON completion.

A stream is complete when it carried a ``finish_reason`` or ended with ``data: [DONE]``. A
stream cut mid-way (the connection drops, the framing is never finished, or the body just
stops without either marker) raises a retryable ModelError. Without ``finish_reason`` it is
inferred: "tool_calls" when calls arrived, else "stop".

Finish reasons: "stop", "tool_calls", "length", "content_filter" (function_call -> tool_calls,
eos/end_turn -> stop, max_tokens -> length; others pass through).

Stream checkpoints and ``resume_from``: see ``runtime.providers.streaming`` (restart).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import openai

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

NAME = "openai"

FINISH_REASONS = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "max_tokens": "length",
    "content_filter": "content_filter",
}


def chat_messages(request: InferenceRequest) -> list[dict[str, Any]]:
    """The committed conversation as chat-completions messages, instructions first."""
    out: list[dict[str, Any]] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    for m in request.messages:
        if m.role == "assistant":
            item: dict[str, Any] = {"role": "assistant"}
            if m.content or not m.tool_calls:
                item["content"] = m.content
            if m.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c.get("arguments") or "{}"},
                    }
                    for c in m.tool_calls
                ]
            out.append(item)
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def chat_tools(request: InferenceRequest) -> list[dict[str, Any]]:
    tools = []
    for spec in request.tools:
        function: dict[str, Any] = {"name": spec.name}
        if spec.description:
            function["description"] = spec.description
        function["parameters"] = dict(spec.parameters)
        tools.append({"type": "function", "function": function})
    return tools


def request_body(
    request: InferenceRequest, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON body sent for ``request``; ``defaults`` are the config's options.

    Deterministic: model, messages, tools, stream, stream_options, then the remaining options
    in sorted key order. ``model`` and ``messages`` cannot be overridden by options.
    """
    options = {**(defaults or {}), **request.options}
    options.pop("model", None)
    options.pop("messages", None)
    stream = bool(options.pop("stream", True))
    stream_options = options.pop("stream_options", {"include_usage": True})
    body: dict[str, Any] = {"model": request.model, "messages": chat_messages(request)}
    if request.tools:
        body["tools"] = chat_tools(request)
    body["stream"] = stream
    if stream and stream_options is not None:
        body["stream_options"] = stream_options
    for key in sorted(options):
        body[key] = options[key]
    return body


async def _sse(lines: AsyncIterable[str]) -> AsyncIterator[tuple[str | None, str]]:
    """Server-Sent Events as (event name, data); an event cut off by the end is dropped."""
    event: str | None = None
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "event":
            event = value
        elif key == "data":
            data.append(value)


def _usage(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        return {}
    usage = {}
    if isinstance(raw.get("prompt_tokens"), int):
        usage["input_tokens"] = raw["prompt_tokens"]
    if isinstance(raw.get("completion_tokens"), int):
        usage["output_tokens"] = raw["completion_tokens"]
    return usage


def _arguments_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value)  # some servers send the arguments as a JSON object


class _Assembly:
    """Chat-completion chunks (plain dicts) folded into the sink, tolerant of server quirks."""

    def __init__(self, sink: StreamSink) -> None:
        self.sink = sink
        self.by_wire_index: dict[int, PartialCall] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.chunks = 0

    def feed(self, chunk: Mapping[str, Any]) -> None:
        self.chunks += 1
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"]) or self.usage
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise errors.malformed(NAME, "choices is not a list")
        for choice in choices:
            if isinstance(choice, Mapping) and choice.get("index", 0) in (0, None):
                self._choice(choice)
                break  # n > 1: only the first choice is the answer

    def _choice(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta") or choice.get("message") or {}
        if not isinstance(delta, Mapping):
            raise errors.malformed(NAME, f"a choice's delta is not an object: {delta!r:.200}")
        content = delta.get("content")
        if isinstance(content, str):
            self.sink.add_text(content)
        wires = delta.get("tool_calls") or []
        if not isinstance(wires, list) or not all(isinstance(w, Mapping) for w in wires):
            raise errors.malformed(NAME, f"tool_calls is not a list of objects: {wires!r:.200}")
        for position, wire in enumerate(wires):
            self._tool_call(position, wire)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
            for call in self.sink.calls:
                self.sink.complete_call(call)

    def _tool_call(self, position: int, wire: Mapping[str, Any]) -> None:
        function = wire.get("function") or {}
        if not isinstance(function, Mapping):
            raise errors.malformed(NAME, f"a tool call's function is not an object: {wire!r:.200}")
        call_id, name = wire.get("id") or None, function.get("name") or ""
        call = self._find(wire.get("index"), position, call_id, name)
        if call is None:
            for earlier in self.sink.calls:  # a new call means the earlier ones are whole
                self.sink.complete_call(earlier)
            call = self.sink.open_call(call_id, name)
            if isinstance(wire.get("index"), int):
                self.by_wire_index[wire["index"]] = call
        else:
            self.sink.name_call(call, name)
        self.sink.add_arguments(call, _arguments_text(function.get("arguments")))

    def _find(
        self, index: Any, position: int, call_id: str | None, name: str
    ) -> PartialCall | None:
        if isinstance(index, int):
            return self.by_wire_index.get(index)
        # No index (Ollama): an id names the call; a fragment without id or name continues
        # the last call; an unknown id or a new name opens the next one.
        if call_id:
            return next((c for c in self.sink.calls if c.id == call_id), None)
        if name or not self.sink.calls or position > 0:
            return None
        return self.sink.calls[-1]

    def finish(self, *, done: bool) -> str:
        """The mapped finish reason; raise a retryable error when the stream stopped short."""
        if self.finish_reason is None and not done:
            raise errors.incomplete(
                NAME, f"no finish_reason and no [DONE] after {self.chunks} chunks"
            )
        for call in self.sink.calls:
            self.sink.complete_call(call)
        has_calls = bool(self.sink.calls)
        raw = self.finish_reason or ("tool_calls" if has_calls else "stop")
        mapped = FINISH_REASONS.get(raw, raw)
        if mapped == "stop" and has_calls:
            return "tool_calls"  # Ollama answers "stop" after a tool call
        if mapped == "tool_calls" and not has_calls:
            return "stop"
        return mapped


class OpenAIProvider:
    """Chat completions over any OpenAI-compatible HTTP server."""

    name = NAME

    def __init__(self, config: ProviderConfig, *, client: openai.AsyncOpenAI | None = None) -> None:
        self.config = config
        key = keys.api_key(config.api_key_env, "OPENAI_API_KEY", NAME)
        self.client = client or openai.AsyncOpenAI(
            base_url=config.base_url,
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
        fixed = {k: body.pop(k) for k in ("model", "messages", "stream")}
        sink = StreamSink(ctx, NAME)
        try:
            async with self.client.chat.completions.with_streaming_response.create(
                **fixed, extra_body=body
            ) as response:
                content_type = response.headers.get("content-type", "")
                if "text/event-stream" in content_type:
                    return await self._stream(response.iter_lines(), sink)
                raw = await response.http_response.aread()
                return self._whole(raw, content_type, sink)
        except ModelError:
            raise
        except openai.APIStatusError as exc:
            raise errors.from_status(
                NAME,
                exc.status_code,
                exc.body,
                exc.response.headers,
                request_id=exc.response.headers.get("x-request-id"),
            ) from exc
        except openai.APIConnectionError as exc:  # includes APITimeoutError
            raise errors.connection(NAME, exc, url=self.url) from exc
        except openai.APIResponseValidationError as exc:
            raise errors.malformed(NAME, str(exc)) from exc
        except errors.transport_errors() as exc:
            raise errors.connection(NAME, exc, mid_stream=True, url=self.url) from exc

    async def _stream(self, lines: AsyncIterable[str], sink: StreamSink) -> InferenceResult:
        assembly = _Assembly(sink)
        done = False
        async for event, data in _sse(lines):
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise errors.malformed(NAME, f"a stream chunk is not JSON: {data[:200]!r}") from exc
            if not isinstance(chunk, Mapping):
                raise errors.malformed(NAME, f"a stream chunk is not an object: {data[:200]!r}")
            if event == "error" or ("error" in chunk and "choices" not in chunk):
                raise errors.midstream(NAME, chunk)
            assembly.feed(chunk)
        finish = assembly.finish(done=done)
        return sink.result(finish, assembly.usage)

    def _whole(self, raw: bytes, content_type: str, sink: StreamSink) -> InferenceResult:
        """A non-streamed ``chat.completion`` (asked for, or a server that ignored stream)."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise errors.malformed(
                NAME, f"{content_type or 'no content type'} body is not JSON: {raw[:200]!r}"
            ) from exc
        if not isinstance(data, Mapping):
            raise errors.malformed(NAME, "the body is not a JSON object")
        if "error" in data and not data.get("choices"):
            raise errors.midstream(NAME, data)  # a 200 that carries an error object
        if not data.get("choices"):
            raise errors.malformed(NAME, "the completion has no choices")
        assembly = _Assembly(sink)
        assembly.feed(data)
        return sink.result(assembly.finish(done=True), assembly.usage)
