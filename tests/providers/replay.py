"""A loopback HTTP server that replays recorded LLM wire exchanges to the real SDK clients.

Each request pops the next queued ``Reply`` (the last one repeats) and is recorded with its
path, headers and parsed JSON body. Framing is real HTTP/1.1: ``Content-Length`` for a whole
body, chunked transfer encoding when the body is split at SSE event boundaries (``"\\n\\n"``)
with a flush after each event, and a cut (``cut_after`` bytes, then the socket is closed
without finishing the framing) to simulate a connection lost mid-stream. ``framing="close"``
sends no length and ends the body by closing the connection cleanly, as an HTTP/1.0-style
server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

WIRE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "wire"


def wire_dir() -> Path:
    """The recorded fixtures: ``RUNTIME_WIRE_FIXTURES`` when set, else tests/fixtures/wire (a
    copy of the shared, read-only recordings, with their licences)."""
    return Path(os.environ.get("RUNTIME_WIRE_FIXTURES") or WIRE_DIR).resolve()


def fixture_names() -> list[str]:
    return sorted(p.name for p in wire_dir().glob("*.json"))


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads((wire_dir() / name).read_text(encoding="utf-8"))


@dataclass(frozen=True, kw_only=True)
class Reply:
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    framing: Literal["length", "chunked", "close"] = "length"
    split: bool = False  # one chunk per SSE event, each flushed
    cut_after: int | None = None  # close the socket after this many body bytes
    stall_after: int | None = None  # go silent after this many body bytes (0: before headers)

    @classmethod
    def from_fixture(cls, fixture: Mapping[str, Any], **overrides: Any) -> Reply:
        response = fixture["response"]
        fields: dict[str, Any] = {
            "status": response["status"],
            "headers": dict(response["headers"]),
            "body": response["body"].encode("utf-8"),
        }
        return cls(**{**fields, **overrides})

    @classmethod
    def sse(cls, events: list[Any], *, done: bool = True, **overrides: Any) -> Reply:
        """An OpenAI-style SSE body from data objects (dicts are JSON-encoded)."""
        parts = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
        if done:
            parts.append("data: [DONE]\n\n")
        headers = {"content-type": "text/event-stream"}
        return cls(headers=headers, body="".join(parts).encode(), **overrides)

    @classmethod
    def json(cls, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Reply:
        return cls(
            status=status,
            headers={"content-type": "application/json", **(headers or {})},
            body=json.dumps(payload).encode(),
        )

    def pieces(self) -> Iterator[bytes]:
        if not self.split:
            yield self.body
            return
        rest = self.body
        while rest:
            cut = rest.find(b"\n\n")
            end = len(rest) if cut < 0 else cut + 2
            yield rest[:end]
            rest = rest[end:]


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any  # parsed JSON, or the raw text when it is not JSON


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.take(Seen("POST", self.path, headers, body))
        if reply.stall_after == 0:
            self._stall()
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.framing == "length":
            self.send_header("content-length", str(len(reply.body)))
        elif reply.framing == "chunked":
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("connection", "close")
        self.end_headers()
        self.wfile.flush()
        sent = 0
        for piece in reply.pieces():
            if reply.stall_after is not None and sent >= reply.stall_after:
                self._stall()
                return
            if reply.cut_after is not None and sent + len(piece) > reply.cut_after:
                piece = piece[: reply.cut_after - sent]
                self._write(reply, piece)
                self._cut()
                return
            self._write(reply, piece)
            sent += len(piece)
        if reply.framing == "chunked":
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        if reply.framing == "close":
            self.close_connection = True

    def _write(self, reply: Reply, piece: bytes) -> None:
        if not piece:
            return
        if reply.framing == "chunked":
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        else:
            self.wfile.write(piece)
        self.wfile.flush()

    def _stall(self) -> None:
        """Send nothing more until the test ends, so the client's read timeout fires."""
        self.server.release.wait(timeout=30)
        self.close_connection = True

    def _cut(self) -> None:
        """Drop the connection mid-body: the framing is never finished."""
        self.close_connection = True
        self.wfile.flush()
        with contextlib.suppress(OSError):  # the client may have gone already
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.replies: list[Reply] = []
        self.seen: list[Seen] = []
        self.release = threading.Event()
        self.errors: list[BaseException | None] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Keep a handler's failure for the test; a client that hung up early is no failure."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError):
            self.errors.append(exc)

    def take(self, seen: Seen) -> Reply:
        with self.lock:
            self.seen.append(seen)
            if not self.replies:
                return Reply.json(500, {"error": {"message": "the replay server has no reply"}})
            return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


class ReplayServer:
    """Start with ``with ReplayServer() as server``; queue replies with ``server.queue(...)``."""

    def __init__(self) -> None:
        self._server = _Server()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def origin(self) -> str:
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET address: (host, port)
        return f"http://{host}:{port}"

    def queue(self, *replies: Reply) -> ReplayServer:
        with self._server.lock:
            self._server.replies.extend(replies)
        return self

    @property
    def errors(self) -> list[BaseException | None]:
        """Exceptions raised inside request handlers (other than a client hanging up)."""
        return list(self._server.errors)

    @property
    def seen(self) -> list[Seen]:
        with self._server.lock:
            return list(self._server.seen)


def infer(provider: Any, request: Any, ctx: Any) -> Any:
    """Run one inference of ``provider`` to its end on an event loop of its own, then close
    the provider's client there (an async client is bound to the loop that used it)."""

    async def once() -> Any:
        try:
            return await provider.infer(request, ctx)
        finally:
            close = getattr(provider, "close", None)
            if close is not None:
                await close()

    return asyncio.run(once())
