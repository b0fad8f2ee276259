"""A real local HTTP server that answers webhooks badly, for the hardening tests (after the
tester's recv.py, issue 23 item 3): ``huge`` answers 500 with a body of ``megabytes`` MB,
``hang`` never answers, ``ok`` answers 200. It records each request's path and Host header."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Hostile:
    mode: str  # ok | hang | huge
    megabytes: int = 0
    got: list[dict[str, str]] = field(default_factory=list)
    written: int = 0  # body bytes of huge answers the client took before it hung up
    release: threading.Event = field(default_factory=threading.Event)  # ends hanging requests
    server: ThreadingHTTPServer | None = None

    def start(self) -> Hostile:
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                hostile.got.append({"path": self.path, "host": self.headers.get("host", "")})
                if hostile.mode == "hang":
                    hostile.release.wait(300)
                    return
                if hostile.mode == "ok":
                    self._answer(200, b"ok")
                    return
                self.send_response(500)
                self.send_header("content-length", str(hostile.megabytes * 2**20))
                self.end_headers()
                chunk = b"x" * 2**20
                try:
                    for _ in range(hostile.megabytes):
                        self.wfile.write(chunk)
                        hostile.written += len(chunk)
                except OSError:  # the client hung up: what we wanted
                    pass

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_address[1]

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/hook"

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
