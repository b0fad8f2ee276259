"""A loopback OpenAI-compatible model server for tests of many runs in flight.

Real HTTP and Server-Sent Events, so the worker's production provider (the official async
client) is the one under test. Every conversation gets the agent shape of the in-flight
benchmark: a request whose last message is the user's is answered with the tool calls given
to the server, one with tool results with a text answer.

A test holds the answers back until enough requests are open at once (``hold(n)``): the
server then knows, without any timing, that ``n`` runs were waiting on their model together.

For the limits tests (issue 23) it can also answer after a ``latency``, answer the next
requests ``429 Too Many Requests`` with a ``Retry-After`` (``throttle``), and keeps when
every request arrived and how it was answered (``arrivals``). For a model outage (issue 31,
item 6) it answers every request ``503`` until the outage is over (``outage``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a burst of hundreds of runs connects at once

    def __init__(self, tool_calls: list[tuple[str, dict[str, Any]]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tool_calls = tool_calls
        self.lock = threading.Condition()
        self.open = {"user": 0, "tool": 0}  # requests being answered now, by their last role
        self.peak = 0  # the most requests open at once
        self.requests = 0
        self.held: str | None = None  # the kind of request held back, if any
        self.held_for = 0  # ... until this many of that kind are open at once
        self.latency = 0.0  # seconds each answer waits before it is sent
        self.throttled = 0  # the next requests answered 429
        self.retry_after = 0.0  # ... with this Retry-After (seconds)
        self.down: set[str] = set()  # an outage: requests of these kinds answered 503
        # (time.monotonic(), status, "user" or "tool": a run's first question or a next one)
        self.arrivals: list[tuple[float, int, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def hold(self, count: int, kind: str = "user") -> None:
        """Hold the answers to requests of ``kind`` ("user": a run's first question, "tool":
        a question after tool results) until ``count`` of them are open at once (then let
        them all go), or until ``release()``."""
        with self.lock:
            self.held, self.held_for = kind, count

    def throttle(self, count: int, retry_after: float) -> None:
        """Answer the next ``count`` requests 429 with ``Retry-After: retry_after``."""
        with self.lock:
            self.throttled, self.retry_after = count, retry_after

    def outage(self, down: bool, kinds: tuple[str, ...] = ("user", "tool")) -> None:
        """Answer requests of ``kinds`` 503 Service Unavailable from now on (True), or no
        longer (False). ``("tool",)``: a run's first question is answered, its next fail."""
        with self.lock:
            self.down = set(kinds) if down else set()

    def _refusal_now(self, kind: str) -> int | None:
        """The status this request (of ``kind``) is refused with, 503 in an outage or 429
        when throttled, or None (and note its arrival)."""
        with self.lock:
            status = 503 if kind in self.down else 429 if self.throttled > 0 else None
            self.throttled -= status == 429
            self.arrivals.append((time.monotonic(), status or 200, kind))
            return status

    def release(self) -> None:
        """Answer every held request now, and later ones at once."""
        with self.lock:
            self.held = None
            self.lock.notify_all()

    def wait_open(self, count: int, kind: str, timeout: float) -> bool:
        """Wait until ``count`` requests of ``kind`` are open at once; False after
        ``timeout`` seconds."""
        with self.lock:
            return self.lock.wait_for(lambda: self.open[kind] >= count, timeout)

    def _enter(self, kind: str) -> None:
        with self.lock:
            self.open[kind] += 1
            self.requests += 1
            self.peak = max(self.peak, sum(self.open.values()))
            if self.held == kind and self.open[kind] >= self.held_for and self.held_for:
                self.held_for = 0  # the wave is complete: every held answer goes, and later
                self.held = None  # ones are not held
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.held != kind)

    def _leave(self, kind: str) -> None:
        with self.lock:
            self.open[kind] -= 1
            self.lock.notify_all()

    def answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks answering ``body``: the tool calls first, then a text answer."""
        base = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "model": "m"}
        if body["messages"][-1]["role"] == "user":
            calls = [
                {
                    "index": i,
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for i, (name, arguments) in enumerate(self.tool_calls)
            ]
            deltas: list[tuple[dict[str, Any], str | None]] = [
                ({"role": "assistant", "tool_calls": calls}, "tool_calls")
            ]
        else:
            deltas = [
                ({"role": "assistant", "content": "all "}, None),
                ({"content": "done"}, "stop"),
            ]
        return [
            {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            for delta, finish in deltas
        ]


class _Handler(BaseHTTPRequestHandler):
    server: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        kind = "user" if body["messages"][-1]["role"] == "user" else "tool"
        status = self.server._refusal_now(kind)
        if status is not None:
            message, type_ = ("slow down", "rate_limit") if status == 429 else ("down", "outage")
            refusal = json.dumps({"error": {"message": message, "type": type_}})
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", f"{self.server.retry_after:g}")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(refusal)))
            self.end_headers()
            self.wfile.write(refusal.encode())
            return
        self.server._enter(kind)
        try:
            if self.server.latency:
                time.sleep(self.server.latency)
            events = b"".join(
                b"data: " + json.dumps(chunk).encode() + b"\n\n"
                for chunk in self.server.answer(body)
            )
            events += b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(events)))
            self.end_headers()
            self.wfile.write(events)
        except (BrokenPipeError, ConnectionResetError):  # the worker was killed
            pass
        finally:
            self.server._leave(kind)


@contextmanager
def model_server(tool_calls: list[tuple[str, dict[str, Any]]]) -> Iterator[ModelServer]:
    """Serve on a free loopback port for the block; every held answer is let go at the end."""
    server = ModelServer(tool_calls)
    thread = threading.Thread(target=server.serve_forever, name="model-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release()
        server.shutdown()
        server.server_close()
