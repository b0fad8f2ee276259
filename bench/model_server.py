"""A local OpenAI-compatible streaming model server for benchmarks: real HTTP and SSE, no model.

``POST /v1/chat/completions`` answers in the chat-completions chunk format (``stream: true``:
Server-Sent Events of ``chat.completion.chunk`` objects ending with ``data: [DONE]``; a usage
chunk before it when ``stream_options.include_usage`` is true; ``stream: false``: one
``chat.completion``). What it answers makes the "assistant" agent shape:

- the last message is the user's (no tool results yet): ``--tool-calls`` calls of
  ``--tool-name`` with the arguments ``{"key": "k<i>", "amount": 1}``, finish reason
  "tool_calls". The ``--tokens`` chunks of the answer are the calls' argument text, split
  evenly between the calls (each call's first chunk carries its id and name; a call gets at
  least one chunk);
- otherwise (tool results present): ``--tokens`` text tokens, finish reason "stop". Token i is
  ``"[i:<send time>] "``: the wall-clock time (``time.time()``, seconds) at which the server
  handed it to the connection, so a live subscriber downstream can compute how late it got it.

Timing of every answer: ``--latency`` seconds before the first chunk, then ``--token-delay``
seconds between two chunks; the closing chunks (finish reason, usage, ``[DONE]``) follow the
last token at once. An answer therefore lasts ``latency + (chunks - 1) * token_delay`` seconds.

Every request is recorded: ``{"conversation", "kind": "tools" | "text", "messages": count,
"received": time the request arrived, "first_chunk": time of the first chunk, "ended": time
the last chunk ([DONE]) was handed to the connection}`` (times: ``time.time()`` seconds). The
conversation is the ``X-Bench-Conversation`` header when sent, else the first user message's
text (benchmarks make it unique per run). ``GET /stats`` returns ``{"settings", "requests"}``,
``POST /reset`` forgets the records, ``GET /healthz`` answers ``ok``.

    python bench/model_server.py --port 8400 --latency 1.0 --tokens 20 --token-delay 0.02

Every flag has an environment default (``BENCH_MODEL_LATENCY``, ``BENCH_MODEL_TOKENS``,
``BENCH_MODEL_TOKEN_DELAY``, ``BENCH_MODEL_TOOL_CALLS``, ``BENCH_MODEL_TOOL_NAME``). With
``--port 0`` the server binds a free port and prints ``port <n>`` as its first line on stdout.
It runs on one asyncio loop under uvicorn (uvloop and httptools when installed): a waiting
stream is a sleeping coroutine, so thousands of concurrent streams cost little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import uvicorn

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

CONVERSATION_HEADER = b"x-bench-conversation"
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
JSON_HEADERS = [(b"content-type", b"application/json")]


@dataclass(frozen=True, slots=True)
class Settings:
    """How every answer is shaped and timed (``latency`` and ``token_delay`` in seconds)."""

    latency: float = 1.0
    tokens: int = 20
    token_delay: float = 0.02
    tool_calls: int = 3
    tool_name: str = "ledger"

    def answer_seconds(self, chunks: int | None = None) -> float:
        """Seconds from a request's arrival to its last chunk, for ``chunks`` content chunks
        (default ``tokens``), if the server had nothing else to do."""
        chunks = self.tokens if chunks is None else chunks
        return self.latency + max(chunks - 1, 0) * self.token_delay

    def tool_answer_chunks(self) -> int:
        """Content chunks of a tool-call answer: ``tokens``, but at least one per call."""
        return max(self.tokens, self.tool_calls)


def split(text: str, parts: int) -> list[str]:
    """``text`` cut into ``parts`` consecutive pieces of near-equal length (some may be empty)."""
    bounds = [round(i * len(text) / parts) for i in range(parts + 1)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def conversation_of(messages: list[dict[str, Any]]) -> str:
    """The text of the first user message (a list of parts: their text joined)."""
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


class Answer:
    """One completion: its chunks (without the timing) as dicts of the wire format."""

    def __init__(self, settings: Settings, model: str, tools: bool) -> None:
        self.settings = settings
        self.model = model
        self.tools = tools
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def deltas(self) -> list[dict[str, Any] | None]:
        """The content deltas in order: a tool-call fragment, or None for a text token (its
        text is made by ``token`` right before it is sent)."""
        s = self.settings
        if not self.tools:
            return [None] * s.tokens
        out: list[dict[str, Any] | None] = []
        per_call = [len(part) for part in split("x" * s.tool_answer_chunks(), s.tool_calls)]
        for call in range(s.tool_calls):
            arguments = json.dumps({"key": f"k{call}", "amount": 1})
            for n, piece in enumerate(split(arguments, per_call[call])):
                wire: dict[str, Any] = {"index": call, "function": {"arguments": piece}}
                if n == 0:
                    wire.update(id=f"call_{call}", type="function")
                    wire["function"]["name"] = s.tool_name
                out.append({"tool_calls": [wire]})
        return out

    @staticmethod
    def token(i: int, delta: dict[str, Any] | None) -> dict[str, Any]:
        """Delta ``i`` as sent: a text token is ``"[i:<time.time() now>] "``."""
        return {"content": f"[{i}:{time.time():.6f}] "} if delta is None else delta

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tools else "stop"

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def whole(self, prompt_tokens: int) -> dict[str, Any]:
        """The non-streamed ``chat.completion`` of the same answer."""
        message: dict[str, Any] = {"role": "assistant", "content": None}
        deltas = [self.token(i, delta) for i, delta in enumerate(self.deltas())]
        if self.tools:
            calls: dict[int, dict[str, Any]] = {}
            for delta in deltas:
                wire = delta["tool_calls"][0]
                call = calls.setdefault(wire["index"], {"function": {"arguments": ""}})
                call.update({k: v for k, v in wire.items() if k not in ("index", "function")})
                call["function"].setdefault("name", wire["function"].get("name"))
                call["function"]["arguments"] += wire["function"]["arguments"]
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            message["content"] = "".join(d["content"] for d in deltas)
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
            "usage": self.usage(prompt_tokens, len(deltas)),
        }


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


class ModelServer:
    """The ASGI application: completions, ``/stats``, ``/reset``, ``/healthz``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.records: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        route = (scope["method"], scope["path"].rstrip("/"))
        if route == ("POST", "/v1/chat/completions"):
            await self.completions(scope, receive, send)
        elif route == ("GET", "/stats"):
            await respond(send, 200, {"settings": asdict(self.settings), "requests": self.records})
        elif route == ("POST", "/reset"):
            self.records = []
            await respond(send, 200, {"reset": True})
        elif route == ("GET", "/healthz"):
            await respond(send, 200, {"ok": True})
        else:
            await respond(send, 404, {"error": {"message": f"no route {route}"}})

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        received = time.time()
        try:
            body = json.loads(await read_body(receive))
            messages = body["messages"]
        except (ValueError, KeyError, TypeError) as exc:
            await respond(send, 400, {"error": {"message": f"bad request: {exc}"}})
            return
        headers = dict(scope["headers"])
        conversation = headers.get(CONVERSATION_HEADER, b"").decode() or conversation_of(messages)
        tools = bool(messages) and messages[-1].get("role") == "user"
        answer = Answer(self.settings, str(body.get("model", "bench")), tools)
        record: dict[str, Any] = {
            "conversation": conversation,
            "kind": "tools" if tools else "text",
            "messages": len(messages),
            "received": received,
        }
        prompt_tokens = sum(len(str(m.get("content") or "")) // 4 for m in messages)
        await asyncio.sleep(self.settings.latency)
        if not body.get("stream"):
            record["first_chunk"] = time.time()
            await respond(send, 200, answer.whole(prompt_tokens))
            record["ended"] = time.time()
        else:
            options = body.get("stream_options") or {}
            stream = self.stream(answer, bool(options.get("include_usage")), prompt_tokens, record)
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            async for piece in stream:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            record["ended"] = time.time()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.records.append(record)

    async def stream(
        self, answer: Answer, usage: bool, prompt_tokens: int, record: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        """The SSE frames of ``answer``, paced: the first at once (the latency is spent), the
        next ones ``token_delay`` apart, the closing frames together with the last token."""
        deltas = answer.deltas()
        for i, template in enumerate(deltas):
            if i:
                await asyncio.sleep(self.settings.token_delay)
            else:
                record["first_chunk"] = time.time()
            delta = answer.token(i, template)
            if i == 0:
                delta = {"role": "assistant", **delta}
            frame = sse(answer.chunk(delta))
            if i == len(deltas) - 1:
                frame += sse(answer.chunk({}, answer.finish_reason))
                if usage:
                    tally = answer.usage(prompt_tokens, len(deltas))
                    frame += sse({**answer.chunk({}), "choices": [], "usage": tally})
                frame += sse("[DONE]")
            yield frame


async def read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def respond(send: Send, status: int, document: Any) -> None:
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": json.dumps(document).encode()})


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        latency=args.latency,
        tokens=args.tokens,
        token_delay=args.token_delay,
        tool_calls=args.tool_calls,
        tool_name=args.tool_name,
    )


def options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the answer-shaping flags (shared with ``bench/inflight.py``)."""
    env = os.environ.get
    parser.add_argument(
        "--latency",
        type=float,
        default=float(env("BENCH_MODEL_LATENCY", "1.0")),
        help="seconds before the first chunk of every answer (default 1.0)",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=int(env("BENCH_MODEL_TOKENS", "20")),
        help="content chunks per answer (default 20)",
    )
    parser.add_argument(
        "--token-delay",
        type=float,
        default=float(env("BENCH_MODEL_TOKEN_DELAY", "0.02")),
        help="seconds between two chunks of an answer (default 0.02)",
    )
    parser.add_argument(
        "--tool-calls",
        type=int,
        default=int(env("BENCH_MODEL_TOOL_CALLS", "3")),
        help="tool calls in the first answer of a conversation (default 3)",
    )
    parser.add_argument(
        "--tool-name",
        default=env("BENCH_MODEL_TOOL_NAME", "ledger"),
        help="the tool those calls name (default ledger)",
    )
    return parser


def loop_kind() -> str:
    """uvloop when it is installed (cheaper per stream), else asyncio's own loop."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def main() -> None:
    parser = options(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback)")
    parser.add_argument("--port", type=int, default=8400, help="0: a free port, printed")
    args = parser.parse_args()
    if args.tokens < 1 or args.tool_calls < 0 or min(args.latency, args.token_delay) < 0:
        parser.error("--tokens must be >= 1; --tool-calls, --latency, --token-delay >= 0")
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    print(f"port {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(
        ModelServer(settings_from(args)),
        log_level="warning",
        access_log=False,
        lifespan="on",
        loop=loop_kind(),
        backlog=8192,
        timeout_keep_alive=60,
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
